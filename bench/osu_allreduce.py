"""``mpiexec -n P python bench/osu_allreduce.py [OSU options]``: thin wrapper of collectives.bench.allreduce."""

import sys

from collectives.bench.catalogue import osu_allreduce

if __name__ == "__main__":
    sys.exit(osu_allreduce())
