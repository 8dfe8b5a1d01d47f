"""``mpiexec -n P python bench/osu_latency.py [OSU options]``: thin wrapper of collectives.bench.latency."""

from collectives.bench.latency import main

if __name__ == "__main__":
    main()
