"""8 B native allreduce repeated on one array, and alternating between two arrays of 2 and 3
float32 (a new signature at every call, so every call checks it across ranks: docs/reliability.md),
medians over rounds, us per call (rank 0): ``mpiexec -n 2 python bench/native_alternating.py CALLS
ROUNDS``."""
import statistics, sys, time
import numpy as np
from mpi4py import MPI
import collectives

comm = MPI.COMM_WORLD
calls, rounds = int(sys.argv[1]), int(sys.argv[2])
a, b = np.ones(2, np.float32), np.ones(3, np.float32)
ya, yb = np.empty_like(a), np.empty_like(b)
o = collectives.Options.from_env()


def loop(alt):
    comm.Barrier()
    t = time.perf_counter()
    for i in range(calls):
        if alt and i & 1:
            collectives.allreduce(b, out=yb, algorithm="native", options=o)
        else:
            collectives.allreduce(a, out=ya, algorithm="native", options=o)
    return (time.perf_counter() - t) / calls * 1e6


loop(True)
res = {"repeat": [], "alternate": []}
for _ in range(rounds):
    res["repeat"].append(loop(False))
    res["alternate"].append(loop(True))
if comm.rank == 0:
    print(collectives.__file__, {k: round(statistics.median(v), 2) for k, v in res.items()})
