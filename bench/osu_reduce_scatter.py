"""``mpiexec -n P python bench/osu_reduce_scatter.py [OSU options]``: thin wrapper of collectives.bench.reduce_scatter."""

import sys

from collectives.bench.catalogue import osu_reduce_scatter

if __name__ == "__main__":
    sys.exit(osu_reduce_scatter())
