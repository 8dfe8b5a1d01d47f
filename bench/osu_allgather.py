"""``mpiexec -n P python bench/osu_allgather.py [OSU options]``: thin wrapper of collectives.bench.allgather."""

import sys

from collectives.bench.catalogue import osu_allgather

if __name__ == "__main__":
    sys.exit(osu_allgather())
