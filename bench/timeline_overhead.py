"""What one timeline span costs: each observation point of the timeline around a no-op, on and off.

``python bench/timeline_overhead.py [--calls 100000] [--rounds 7]`` (one process, no mpiexec)

Each observation point (``observe.py``) is reached ``--calls`` times with the timeline
off (no observer registered: the point's test alone) and on (the timeline's observers
registered, recording), in turns within each round so that load on a shared machine hits both
alike; the work inside is next to nothing, so on minus off is the cost of one span: the
observer's call, two clock reads, the span's arguments and the append. Times
are the process's CPU time (``time.process_time``), not the wall clock, so that the time other
processes of a loaded machine take from this one does not count.

- ``call``: ``Guard.run`` of a function that returns at once, with a checked ``AllreduceCall``
  on the guard (its count, dtype, bytes and algorithm are what the span records); the guard is
  ``COMM_SELF``'s, from ``collectives.diagnostics.probe``, which exists for such measurements
  (a public call on one rank skips the guard);
- ``message``: ``Guard.complete`` of no requests (one exchange round's span);
- ``reduce``: ``Op.combine`` of two 1-element arrays (one local reduction's span);
- ``append``: ``Recorder.add`` alone;
- ``python call``: a call of an empty Python function, the yardstick of the machine's speed at
  the time (a span costs a few of them).

``--json FILE`` writes the medians.

``--only POINT:STATE`` (e.g. ``call:on``) runs that one loop of ``--calls`` calls and nothing
else, for an instruction count that no other job on the machine disturbs: the count of a run
``on`` minus that of a run ``off`` (every import done in both), over ``--calls``, is the
instructions one span costs::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python bench/timeline_overhead.py --only call:on --calls 100000   # and call:off
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives.api import AllreduceCall
from collectives.diagnostics.probe import context
from collectives.diagnostics.timeline import hooks
from collectives.diagnostics.timeline.recorder import Recorder
from collectives.ops import OPS


def nothing() -> None:
    pass


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    ap.add_argument("--only", metavar="POINT:STATE",
                    help="run one loop (call, message or reduce; on or off) and nothing else")
    args = ap.parse_args(argv)
    guard = context(MPI.COMM_SELF).guard
    x = np.ones(2, dtype=np.float32)
    call = AllreduceCall(MPI.COMM_SELF, x, None, "sum", "ring", collectives.Options())
    a, b = np.ones(1, np.float32), np.ones(1, np.float32)
    op = OPS["sum"]

    def with_call():  # as a blocking entry point does: the guard holds it, and it is returned
        guard.call = call
        return call

    rec = Recorder()
    points = {
        "call": lambda: guard.run("allreduce", with_call),
        "message": lambda: guard.complete([], [], []),
        "reduce": lambda: op.combine(a, b, a),
    }
    if args.only:
        point, state = args.only.split(":")
        f = points[point]
        f()
        hooks.install(rec)  # the imports registering makes, in both states
        hooks.uninstall()
        if state == "on":
            hooks.install(rec)
        for _ in range(args.calls):
            f()
        hooks.uninstall()
        return {}
    times: dict[str, list[float]] = {f"{name} {state}": [] for name in points
                                     for state in ("off", "on")}
    times["append"], times["python call"] = [], []
    n = args.calls
    for _ in range(args.rounds):
        for name, f in points.items():
            for state in ("off", "on"):
                if state == "on":
                    hooks.install(rec)
                start = time.process_time()
                for _ in range(n):
                    f()
                times[f"{name} {state}"].append((time.process_time() - start) / n * 1e6)
                if state == "on":
                    hooks.uninstall()
        add = rec.add
        start = time.process_time()
        for _ in range(n):
            add("message", "send", 0.0, 1.0, None)
        times["append"].append((time.process_time() - start) / n * 1e6)
        rec = Recorder()  # keep memory flat
        start = time.process_time()
        for _ in range(n):
            nothing()
        times["python call"].append((time.process_time() - start) / n * 1e6)
    medians = {name: float(np.median(t)) for name, t in times.items()}
    print(f"# us per call, median of {args.rounds} rounds of {n} calls")
    print(f"{'hook point':<12}{'off':>8}{'on':>8}{'per span':>10}")
    for name in points:
        off, on = medians[f"{name} off"], medians[f"{name} on"]
        print(f"{name:<12}{off:>8.3f}{on:>8.3f}{on - off:>10.3f}")
    print(f"{'append':<12}{'':>8}{medians['append']:>8.3f}")
    print(f"{'python call':<12}{'':>8}{medians['python call']:>8.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"calls": n, "rounds": times, "median_us": medians}, fh, indent=1)
    return medians


if __name__ == "__main__":
    main()
