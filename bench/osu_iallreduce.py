"""``mpiexec -n P python bench/osu_iallreduce.py [OSU options]``: thin wrapper of collectives.bench.iallreduce."""

from collectives.bench.iallreduce import main

if __name__ == "__main__":
    main()
