"""A process's first ``compressed_allreduce`` (top-k 1 % with error feedback) on a cold Numba
cache, at one size, with or without a default ``allreduce`` just before it.

``NUMBA_CACHE_DIR=$(mktemp -d) mpiexec -n 2 python bench/first_compressed.py N [--allreduce-first]``

Both ranks make ``N`` float32 elements, meet at a barrier, optionally call
``collectives.allreduce(x)`` (whose shared-memory kernel then compiles in a background thread,
docs/benchmarks/first-call.md), then time the first ``collectives.compressed_allreduce(x,
compress.ErrorFeedback(topk))``. Rank 0 prints the slowest rank's seconds and the machine's
load. Give every run a new empty cache directory: the point is the compile.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

import collectives
import compress


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", type=int, help="float32 elements")
    ap.add_argument("--allreduce-first", action="store_true",
                    help="a default allreduce of the same array just before")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    x = np.random.default_rng(comm.rank).standard_normal(args.n).astype(np.float32)
    codec = compress.ErrorFeedback(compress.get("topk", ratio=0.01))
    comm.Barrier()
    if args.allreduce_first:
        collectives.allreduce(x)
    t0 = time.perf_counter()
    collectives.compressed_allreduce(x, codec)
    slowest = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    if comm.rank == 0:
        print(f"n={args.n} allreduce first={args.allreduce_first}: first compressed call "
              f"{slowest:.2f} s (slowest rank), load {os.getloadavg()[0]:.1f}")
    return slowest


if __name__ == "__main__":
    main()
