"""``mpiexec -n P python bench/osu_bw.py [OSU options]``: thin wrapper of collectives.bench.bw."""

import sys

from collectives.bench.catalogue import osu_bw

if __name__ == "__main__":
    sys.exit(osu_bw())
