"""``mpiexec -n P python bench/osu_bcast.py [OSU options]``: thin wrapper of collectives.bench.bcast."""

import sys

from collectives.bench.catalogue import osu_bcast

if __name__ == "__main__":
    sys.exit(osu_bcast())
