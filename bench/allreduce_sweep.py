"""Quick side-by-side sweep of every allreduce algorithm against MPI_Allreduce.

Run ``mpiexec -n P python bench/allreduce_sweep.py [--sizes 8,1024,...] [--node-size 2]``. All
algorithms are interleaved in one loop (so drift hits every column alike); rank 0 prints the median
time per call in microseconds, averaged over ranks, and each algorithm's ratio to native. The
OSU-compatible benchmarks (benchmark issue) supersede this; it is what docs/algorithms.md quotes.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import collectives

ALGORITHMS = ["native", "ring", "tree", "recursive_doubling", "rabenseifner", "hierarchical"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="8,1024,8192,65536,262144,1048576,4194304",
                        help="message sizes in bytes, comma-separated (float32 elements)")
    parser.add_argument("--node-size", type=int, default=2, help="emulated node size (hierarchical)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    opts = collectives.Options(node_size=args.node_size)
    if comm.rank == 0:
        print(f"# p={comm.size}, median us per call (ratio to native)")
        print(f"{'bytes':>9} " + " ".join(f"{a:>22}" for a in ALGORITHMS))
    for nbytes in (int(s) for s in args.sizes.split(",")):
        x = np.ones(max(nbytes // 4, 1), np.float32)
        y = np.empty_like(x)
        iters = 200 if nbytes <= 65536 else 20
        times: dict[str, list[float]] = {a: [] for a in ALGORITHMS}
        for it in range(iters + 5):
            for a in ALGORITHMS:
                comm.Barrier()
                t = time.perf_counter()
                collectives.allreduce(x, out=y, algorithm=a, options=opts)
                if it >= 5:  # warm-up
                    times[a].append(time.perf_counter() - t)
        med = {a: comm.allreduce(float(np.median(times[a]))) / comm.size * 1e6 for a in ALGORITHMS}
        if comm.rank == 0:
            cells = " ".join(f"{med[a]:>13.1f} ({med[a] / med['native']:5.2f})" for a in ALGORITHMS)
            print(f"{x.nbytes:>9} {cells}", flush=True)


if __name__ == "__main__":
    import sys

    from collectives._runtime.cli import program

    sys.exit(program("allreduce_sweep", main)())
