"""What the flight recorder adds to a call: ``Guard.run`` of an empty call, recorder on and off.

``python bench/flight_recorder_cost.py [--calls 5000] [--rounds 30]``

One process, no peers: two guards on ``COMM_SELF`` run the same empty call (described once, as a
repeated ``allreduce`` is), one with its flight recorder (``collectives._runtime.flight``) and
one without; they take turns (each first every other round), ``--calls`` calls per turn, timed
as a whole. Reported: per variant
the minimum and the median over rounds of the time per call, in nanoseconds, and the difference
of the minimums (the recorder's cost, least disturbed by other processes on a shared machine).
The rest of a call (the guard's bookkeeping, the algorithm, MPI) is the same with and without
it: ``bench/call_overhead.py --recorder`` measures a whole 8 B allreduce on 2 ranks.
"""

from __future__ import annotations

import argparse
import statistics
import time

from mpi4py import MPI

from collectives._runtime.context import Context


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000, help="calls per turn")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    on, off = Context(MPI.COMM_SELF), Context(MPI.COMM_SELF)
    off.guard.ring = off.guard.records = None
    what = (None, 2, None, "sum", "auto: shm")

    def empty() -> None:
        pass

    times: dict[str, list[float]] = {"recorder on": [], "recorder off": []}
    turns = [("recorder on", on), ("recorder off", off)]
    for k in range(args.rounds):
        for name, ctx in turns[::-1] if k % 2 else turns:  # each goes first every other round
            run = ctx.guard.run
            start = time.perf_counter()
            for _ in range(args.calls):
                run("allreduce", empty, timeout=None, what=what)
            times[name].append((time.perf_counter() - start) / args.calls * 1e9)
    print(f"# Guard.run of an empty call, ns per call, {args.rounds} rounds of {args.calls}")
    print(f"{'variant':<16}{'min':>8}{'median':>8}")
    for name, t in times.items():
        print(f"{name:<16}{min(t):>8.0f}{statistics.median(t):>8.0f}")
    cost = min(times["recorder on"]) - min(times["recorder off"])
    print(f"recorder: +{cost:.0f} ns per call (difference of the minimums)")
    on.free()
    off.free()
    return {"cost_ns": cost}


if __name__ == "__main__":
    main()
