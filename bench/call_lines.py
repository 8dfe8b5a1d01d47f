"""The Python work of one small call, counted: functions entered and lines run, per layer.

``mpiexec -n 2 python bench/call_lines.py [--bytes 8] [--detail] [--json FILE]``

Timing a call of a few microseconds on a shared machine moves by tens of percent from run to
run; this count does not. Each variant is warmed up on both ranks (the checks remembered, "auto"
resolved, the lanes made), then on rank 0 only its algorithm's run is swapped for a function
that does nothing and one more call is traced (``sys.settrace``): what is left is everything
the library does around the algorithm, which is the whole per-call overhead at 8 B. Rank 1 only
waits; the ranks' call numbers differ afterwards, so the job ends there.

- ``plan()``: a persistent plan's blocking run (``collectives.allreduce_init``);
- ``allreduce``: ``collectives.allreduce(x, out=y)``, a remembered repeat;
- ``iallreduce+wait``: ``collectives.iallreduce(x, out=y).wait()``, a remembered repeat run by
  its ``wait()`` on this thread (small, the engine idle).

Printed per variant: the functions entered and the lines run (the do-nothing run counts as
neither); ``--detail`` adds them per function. The swap reaches into the library's private
state (the plan's prepared run, the remembered entries), so this script fails loudly, not
silently, when those change.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from functools import partial
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

import collectives
from collectives._runtime.repeats import REPEATS


def _nothing(*args: Any) -> None:
    """The algorithm's run, swapped in: no communication, no Python lines counted."""


def _swap(variant: str, plan: Any) -> None:
    """Make ``variant``'s next call run :func:`_nothing` instead of its algorithm."""
    if variant == "plan()":
        run = plan._blocking  # partial(runner.run, "allreduce", fn, src, dst, ...)
        if not isinstance(run, partial) or run.args[0] != "allreduce":
            raise SystemExit("plan()'s prepared run is not the partial this script expects")
        plan._blocking = partial(run.func, run.args[0], _nothing, *run.args[2:], **run.keywords)
    elif variant == "allreduce":
        _remembered("allreduce").fn = _nothing
    elif variant == "iallreduce+wait":
        last = _remembered("iallreduce")
        if last.decided[1] is None:
            raise SystemExit("no remembered iallreduce with a decided run to swap")
        last.decided[1] = _nothing
    else:
        raise ValueError(variant)


def _remembered(form: str) -> Any:
    """The most recently used remembered call of ``form`` ("allreduce", "iallreduce")."""
    for entry in REPEATS.recent:
        if entry.form == form:
            return entry
    raise SystemExit(f"no remembered {form} to swap")


def _count(fn: Callable[[], Any]) -> dict[str, list[int]]:
    """``fn()`` traced: {"file.py:function": [calls, lines]}, the do-nothing run left out."""
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])

    def trace(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code is _nothing.__code__:
            return None
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
    if comm.rank == 0:
        for name, fn in variants.items():
            _swap(name, plan)
            fn()  # the first call on the swapped run (a lane's first use has its own path)
            results[name] = _count(fn)
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
