"""``mpiexec -n P python bench/osu_allreduce.py [OSU options]``: thin wrapper of collectives.bench.allreduce."""

from collectives.bench.allreduce import main

if __name__ == "__main__":
    main()
