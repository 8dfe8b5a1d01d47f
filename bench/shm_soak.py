"""Soak the shared-memory allreduce: memory and mappings stay flat over many calls and windows.

``mpiexec -n P python bench/shm_soak.py [--calls 100000] [--comms 1000] [--every 10000]``

Runs ``--calls`` allreduces with ``algorithm="shm"`` on one communicator (alternating a short
vector, the replicated mode, and a long one, the block-per-rank mode, with NumPy and with
``collectives.empty`` buffers), then ``--comms`` times: duplicate ``COMM_WORLD``, allreduce on the
duplicate (which creates its context, shared window and a ``collectives.empty`` buffer), free it.
Rank 0 prints the resident memory (``VmRSS``), the number of memory mappings and of open file
descriptors of its process along the way; a leak of windows shows in all three.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

import collectives


def usage() -> tuple[int, int, int]:
    """(resident kB, mappings, open file descriptors) of this process (Linux)."""
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return rss, maps, len(os.listdir("/proc/self/fd"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--comms", type=int, default=1000)
    parser.add_argument("--every", type=int, default=10_000, help="report every this many calls")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    short, long_ = np.ones(256, np.float32), np.ones(1 << 16, np.float32)
    shared_short, shared_long = collectives.empty(256, np.float32), collectives.empty(1 << 16)
    shared_short[:], shared_long[:] = 1, 1
    vectors = [short, long_, shared_short, shared_long]

    def report(what: str) -> None:
        rss, maps, fds = usage()
        if world.rank == 0:
            print(f"{what:>24}: rss {rss:>8} kB  mappings {maps:>5}  fds {fds:>4}  "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)

    start = time.perf_counter()
    report("start")
    for k in range(args.calls):
        x = vectors[k % 4]
        y = collectives.allreduce(x, out=x if k % 8 >= 4 else None, algorithm="shm")
        if k % 8 >= 4:
            x[:] = 1  # undo the in-place sum
        elif not (y == world.size).all():
            raise SystemExit(f"wrong result at call {k}")
        if (k + 1) % args.every == 0:
            report(f"{k + 1} calls")
    for k in range(args.comms):
        comm = world.Dup()
        buf = collectives.empty(1000, np.float64, comm)
        buf[:] = 1
        collectives.allreduce(buf, out=buf, algorithm="shm", comm=comm)
        collectives.allreduce(np.ones(1000), algorithm="shm", comm=comm)
        del buf
        comm.Free()
        if (k + 1) % max(args.comms // 10, 1) == 0:
            report(f"{k + 1} communicators")


if __name__ == "__main__":
    main()
