"""How soon Horovod's ``allreduce_async`` returns when another rank submits late.

Run ``mpiexec -n 2 python bench/horovod_async.py [--repeats 5] [--late 0.5]``. Each repeat:
a barrier, then rank 1 sleeps ``--late`` seconds before it submits
``hvd.allreduce_async(x, name=...)`` (1000 floats) while rank 0 submits at once; rank 0 prints the
median time its ``allreduce_async`` took to return and the median time until its
``synchronize`` returned. With the call negotiated in the background (the named stream,
``collectives.torch.negotiation``) the first is well under a millisecond; with a negotiation
before the call returns it is the other rank's lateness.
"""

import argparse
import statistics
import time

import torch
from mpi4py import MPI

import collectives.torch as hvd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--late", type=float, default=0.5, help="rank 1's delay, seconds")
    args = p.parse_args()
    hvd.init()
    comm, r = MPI.COMM_WORLD, hvd.rank()
    x = torch.ones(1000)
    hvd.allreduce(x)  # the engine's set-up (collective) out of the way
    returned, done = [], []
    for i in range(args.repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        if r == 1:
            time.sleep(args.late)
        h = hvd.allreduce_async(x, name=f"late.{i}")
        returned.append(time.perf_counter() - t0)
        hvd.synchronize(h)
        done.append(time.perf_counter() - t0)
    if r == 0:
        print(f"{comm.size} ranks, rank 1 late by {args.late * 1e3:.0f} ms: allreduce_async "
              f"returned after {statistics.median(returned) * 1e3:.2f} ms, synchronize after "
              f"{statistics.median(done) * 1e3:.0f} ms (medians of {args.repeats})")


if __name__ == "__main__":
    main()
