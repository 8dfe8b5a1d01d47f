"""``mpiexec -n P python bench/osu_allgather.py [OSU options]``: thin wrapper of collectives.bench.allgather."""

from collectives.bench.allgather import main

if __name__ == "__main__":
    main()
