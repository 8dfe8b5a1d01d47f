"""``mpiexec -n P python bench/osu_bw.py [OSU options]``: thin wrapper of collectives.bench.bw."""

from collectives.bench.bw import main

if __name__ == "__main__":
    main()
