"""What the flight recorder adds to a call: a guarded call that moves nothing, recorder on and off.

``mpiexec -n 2 python bench/flight_recorder_cost.py [--calls 5000] [--rounds 30]``

Each rank makes ``collectives.allreduce`` calls of zero elements on two duplicates of
``COMM_WORLD``: the first made with the flight recorder (``COLLECTIVES_FLIGHT_RECORDER`` unset,
its default), the second with ``COLLECTIVES_FLIGHT_RECORDER=0`` set while its first call makes
the communicator's guard (the variable is read then; docs/debugging.md). A call of zero elements
is checked and numbered by the failure guard, recorded when the recorder is on, and sends
nothing, so no rank waits for another within a turn. The variants take turns (each first every
other round), ``--calls`` calls per turn, timed as a whole, on rank 0. Reported: per variant the
minimum and the median over rounds of the time per call, in nanoseconds, and the difference of
the minimums (the recorder's cost, least disturbed by other processes on a shared machine).
The rest of a call (its checks, the guard's bookkeeping) is the same with and without it:
``bench/call_overhead.py --recorder`` measures a whole 8 B allreduce on 2 ranks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import collectives

#: the recorder's switch (docs/debugging.md): the number of calls kept, 0 for none
RECORDER_ENV = "COLLECTIVES_FLIGHT_RECORDER"


def _made_without_recorder(comm: MPI.Comm, first: object) -> None:
    """Run ``first()``, the first call on ``comm``, with the recorder switched off."""
    kept = os.environ.get(RECORDER_ENV)
    os.environ[RECORDER_ENV] = "0"
    try:
        first()
    finally:
        if kept is None:
            del os.environ[RECORDER_ENV]
        else:
            os.environ[RECORDER_ENV] = kept


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000, help="calls per turn")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    if world.size < 2:
        raise SystemExit("run it with mpiexec -n 2 or more: one rank's calls skip the guard")
    x, y = np.empty(0, np.float32), np.empty(0, np.float32)
    on, off = world.Dup(), world.Dup()
    collectives.allreduce(x, out=y, comm=on)
    _made_without_recorder(off, lambda: collectives.allreduce(x, out=y, comm=off))
    allreduce = collectives.allreduce
    times: dict[str, list[float]] = {"recorder on": [], "recorder off": []}
    turns = [("recorder on", on), ("recorder off", off)]
    for k in range(args.rounds):
        for name, comm in turns[::-1] if k % 2 else turns:  # each goes first every other round
            world.Barrier()
            start = time.perf_counter()
            for _ in range(args.calls):
                allreduce(x, out=y, comm=comm)
            times[name].append((time.perf_counter() - start) / args.calls * 1e9)
    cost = min(times["recorder on"]) - min(times["recorder off"])
    if world.rank == 0:
        print(f"# allreduce of 0 elements, ns per call, {world.size} ranks, {args.rounds} rounds "
              f"of {args.calls}")
        print(f"{'variant':<16}{'min':>8}{'median':>8}")
        for name, t in times.items():
            print(f"{name:<16}{min(t):>8.0f}{statistics.median(t):>8.0f}")
        print(f"recorder: {cost:+.0f} ns per call (difference of the minimums)")
    on.Free()
    off.Free()
    return {"cost_ns": cost}


if __name__ == "__main__":
    main()
