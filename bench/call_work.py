"""The CPU time of a small call's own work: alltoall, barrier, send and recv, side by side.

``mpiexec -n 2 python bench/call_work.py [--calls 5000] [--rounds 7] [--label TEXT]``

What a call does around its communication, measured where no communication happens:
``collectives.alltoall(x, out=y)`` and ``collectives.barrier()`` with an algorithm that does
nothing (an entry ``"noop"`` added here to the public tables ``collectives.ALLTOALL`` and
``collectives.BARRIER``, so that the options, checks, call object, repeat lookup and the
guard's call are what runs), and ``collectives.send``/``recv`` of 64 KiB of float32 to and from
``MPI.PROC_NULL`` (MPI returns at once), beside mpi4py's ``comm.Send``/``comm.Recv`` of the
same. Each variant makes ``--calls`` calls in a row on the same arrays (so the library's
repeats are what is timed), timed by ``time.process_time_ns``: the CPU time of this process,
which a shared machine's other jobs do not inflate the way they inflate wall time when they
take the core away. Variants take turns in every round; rank 0 prints the median over rounds
of the CPU nanoseconds per call.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import collectives


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--label", default="", help="printed at the start of the row")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    p = comm.size
    collectives.ALLTOALL["noop"] = lambda *a: None
    collectives.BARRIER["noop"] = lambda *a: None
    x = np.arange(2 * p, dtype=np.float32)
    y = np.empty_like(x)
    big = np.zeros(16384, np.float32)
    got = np.empty_like(big)
    null = MPI.PROC_NULL
    calls = {"alltoall": lambda: collectives.alltoall(x, out=y, algorithm="noop"),
             "barrier": lambda: collectives.barrier(algorithm="noop"),
             "send": lambda: collectives.send(big, null),
             "recv": lambda: collectives.recv(got, null),
             "comm.Send": lambda: comm.Send(big, null),
             "comm.Recv": lambda: comm.Recv(got, null)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():  # warm: the first calls check and remember
        for _ in range(100):
            fn()
    for _ in range(args.rounds):
        for name, fn in calls.items():
            comm.Barrier()
            t0 = time.process_time_ns()
            for _ in range(args.calls):
                fn()
            times[name].append((time.process_time_ns() - t0) / args.calls)
    if comm.rank == 0:
        cells = "  ".join(f"{name} {float(np.median(v)):7.0f}" for name, v in times.items())
        print(f"{args.label}{cells}   (CPU ns per call, median of {args.rounds} rounds, p = {p})")


if __name__ == "__main__":
    main()
