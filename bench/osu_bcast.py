"""``mpiexec -n P python bench/osu_bcast.py [OSU options]``: thin wrapper of collectives.bench.bcast."""

from collectives.bench.bcast import main

if __name__ == "__main__":
    main()
