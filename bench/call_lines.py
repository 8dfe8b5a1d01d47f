"""The Python work of one small call, counted: functions entered and lines run, per layer.

``mpiexec -n 2 python bench/call_lines.py [--bytes 8] [--detail] [--json FILE]``

Timing a call of a few microseconds on a shared machine moves by tens of percent from run to
run; this count does not. Each variant is warmed up on both ranks (the checks remembered, "auto"
resolved, the lanes made), then one more call is made on both ranks and traced on rank 0
(``sys.settrace``), leaving out the algorithm: the first frame whose code lives in the
``collectives.algorithms`` package (the lane or the algorithm function a call runs) and every
frame below it are neither counted nor traced line by line. What is left is everything the
library does around the algorithm, which is the whole per-call overhead at 8 B. Only public
names are used: the algorithm is told apart by the folder of its code.

- ``plan()``: a persistent plan's blocking run (``collectives.allreduce_init``);
- ``allreduce``: ``collectives.allreduce(x, out=y)``, a remembered repeat;
- ``iallreduce+wait``: ``collectives.iallreduce(x, out=y).wait()``, a remembered repeat run by
  its ``wait()`` on this thread (small, the engine idle).

Printed per variant: the functions entered and the lines run (the algorithm counts as
neither); ``--detail`` adds them per function.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

import collectives
import collectives.algorithms
#: where the algorithms live: a frame whose code is in this folder is the algorithm
ALGORITHMS_DIR = os.path.dirname(collectives.algorithms.__file__) + os.sep


def _count(fn: Callable[[], Any]) -> dict[str, list[int]]:
    """``fn()`` traced: {"file.py:function": [calls, lines]}, the do-nothing run left out."""
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])

    inside = [None]  # the algorithm's frame while it runs: nothing below it is counted

    def algorithm_returns(frame: Any, event: str, arg: Any) -> Any:
        if event == "return":
            inside[0] = None
        return None if event == "return" else algorithm_returns

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if inside[0] is not None:
            return None
        code = frame.f_code
        if code.co_filename.startswith(ALGORITHMS_DIR):
            inside[0] = frame
            return algorithm_returns
        key = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"
        if event == "call":
            counts[key][0] += 1
        elif event == "line":
            counts[key][1] += 1
        return trace

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    counts.pop(f"{__file__.rsplit('/', 1)[-1]}:<lambda>", None)  # the variant's own lambda
    return dict(counts)


def main(argv: list[str] | None = None) -> dict[str, dict[str, list[int]]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--detail", action="store_true", help="calls and lines per function too")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        raise SystemExit("run it with mpiexec -n 2 or more: one rank runs no algorithm at all")
    x = np.ones(max(1, args.bytes // 4), dtype=np.float32)
    y = np.empty_like(x)
    plan = collectives.allreduce_init(x, out=y)
    variants: dict[str, Callable[[], Any]] = {
        "plan()": plan,
        "allreduce": lambda: collectives.allreduce(x, out=y),
        "iallreduce+wait": lambda: collectives.iallreduce(x, out=y).wait(),
    }
    for _ in range(50):  # every rank: checks remembered, "auto" resolved, lanes made
        for fn in variants.values():
            fn()
    comm.Barrier()
    results: dict[str, dict[str, list[int]]] = {}
    for name, fn in variants.items():  # every rank makes the call; rank 0 traces it
        comm.Barrier()
        if comm.rank == 0:
            results[name] = _count(fn)
        else:
            fn()
    if comm.rank == 0:
        print(f"# Python work of one call around its algorithm, {x.nbytes} B, {comm.size} ranks")
        print(f"{'variant':<20}{'functions':>10}{'lines':>8}")
        for name, counts in results.items():
            calls = sum(c for c, _ in counts.values())
            lines = sum(n for _, n in counts.values())
            print(f"{name:<20}{calls:>10}{lines:>8}")
            if args.detail:
                for where, (c, n) in sorted(counts.items(), key=lambda kv: -kv[1][1]):
                    print(f"    {where:<40}{c:>6}{n:>8}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"bytes": int(x.nbytes), "ranks": comm.size, "counts": results},
                          fh, indent=1)
    comm.Barrier()
    return results


if __name__ == "__main__":
    main()
