"""The CPU time of each rank's own work in an alltoall, its waits left out, per algorithm.

``COLLECTIVES_NODE_SIZE=4 mpiexec -n 8 python bench/alltoall_cpu.py [--algorithms hierarchical,pairwise]
[--sizes 64,1024,16384] [--calls 200]``

Each rank makes ``--calls`` calls of ``collectives.alltoall(x, out=y, algorithm=...)`` in a row
(bytes per block from ``--sizes``, float32) and times them with ``time.thread_time_ns``, less
the thread time spent inside ``Guard.complete`` (the waits: the guard's polling, which spins as
long as the other ranks take), which this tool wraps for the measurement. What is left is the
rank's Python, copies and message posting: where ranks share cores, a call lasts at least their
sum over ranks divided by the cores. A rank's thread time does not run while it is
descheduled, so a loaded machine inflates it far less than wall time. Rank 0 prints, per
algorithm and size, every rank's microseconds per call and their sum; results are checked.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives._runtime import guard as _guard
from collectives.tools.osu.options import parse_sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", default="hierarchical,pairwise")
    ap.add_argument("--sizes", type=parse_sizes, default=[64, 1024, 16384])
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    inside = [0]
    complete = _guard.Guard.complete

    def timed(self, *a, **kw):  # the waits' thread time, to leave out
        t0 = time.thread_time_ns()
        try:
            return complete(self, *a, **kw)
        finally:
            inside[0] += time.thread_time_ns() - t0

    _guard.Guard.complete = timed
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    for alg in args.algorithms.split(","):
        for nbytes in args.sizes:
            n = max(nbytes // 4, 1)
            x = np.repeat(np.arange(p, dtype=np.float32) + 1000 * rank, n)
            y = np.empty_like(x)
            for _ in range(20):  # warm: layouts, plans, buffers
                collectives.alltoall(x, out=y, algorithm=alg)
            comm.Barrier()
            inside[0] = 0
            c0 = time.thread_time_ns()
            for _ in range(args.calls):
                collectives.alltoall(x, out=y, algorithm=alg)
            cpu = (time.thread_time_ns() - c0 - inside[0]) / args.calls / 1e3
            assert np.array_equal(y, np.repeat(1000 * np.arange(p, dtype=np.float32) + rank, n))
            every = comm.gather(cpu, root=0)
            if rank == 0:
                print(f"{alg:>12} {nbytes:>6} B: CPU us/call outside waits: rank 0 {every[0]:6.1f}, "
                      f"max {max(every):6.1f}, sum over ranks {sum(every):7.1f}  "
                      f"(per rank: {' '.join(f'{v:.0f}' for v in every)})", flush=True)


if __name__ == "__main__":
    main()
