"""``mpiexec -n P python bench/osu_latency.py [OSU options]``: thin wrapper of collectives.bench.latency."""

import sys

from collectives.bench.catalogue import osu_latency

if __name__ == "__main__":
    sys.exit(osu_latency())
