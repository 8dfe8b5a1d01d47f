"""``mpiexec -n P python bench/osu_reduce_scatter.py [OSU options]``: thin wrapper of collectives.bench.reduce_scatter."""

from collectives.bench.reduce_scatter import main

if __name__ == "__main__":
    main()
