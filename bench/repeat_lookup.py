"""The remembered allreduce's own work per repeat: finding the entry and re-checking the arrays.

``python bench/repeat_lookup.py --calls N [--in-place]``

Calls ``collectives.allreduce(x, out=...)`` ``N`` times with one remembered entry of 8 B of
float32 (``api._REPEATS``) whose run is a no-op, so what is left is the public call's repeat
path: the lookup (weak references, names), the options in force and the re-checks of what can
change in place. No MPI call is made. Meant for counting instructions, which no other job on
the machine moves, as the difference of two runs::

    export OPENBLAS_NUM_THREADS=1   # OpenBLAS's idle threads spin inside the count otherwise
    for n in 0 20000; do
      valgrind --tool=callgrind --callgrind-out-file=/dev/null python bench/repeat_lookup.py \\
          --calls $n [--in-place] 2>&1 | grep Collected
    done   # (second - first) / 20000: instructions per repeat

Without valgrind it prints the mean time per repeat (a noisy machine moves it).
"""

from __future__ import annotations

import argparse
import time
import types
import weakref
from typing import Any

import numpy as np
from mpi4py import MPI

import collectives
from collectives import api
from collectives.options import Options


def _nothing(*args: Any, **kwargs: Any) -> None:
    """The entry's run in the timed calls."""


def _entry(x: np.ndarray, out: np.ndarray, run: Any) -> types.SimpleNamespace:
    """What ``api._Repeat`` keeps that a repeat reads, with ``run`` as its run."""
    return types.SimpleNamespace(
        x=weakref.ref(x), out=weakref.ref(out), opname="sum", algorithm="auto", comm_arg=None,
        comm=MPI.COMM_WORLD,
        shape=x.shape, xstrides=x.strides, ostrides=out.strides, dtype=x.dtype,
        opts=Options.from_env(), ctx=types.SimpleNamespace(live=True),
        run=run, vector=True, inplace=out is x, op=None, fn=None,
        what=None)


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--in-place", action="store_true", help="allreduce(x, out=x)")
    args = ap.parse_args(argv)
    x = np.ones(2, np.float32)
    out = x if args.in_place else np.ones(2, np.float32)
    ran = []
    entry = _entry(x, out, lambda *args, **kwargs: ran.append(1))  # one call: is it a repeat?
    kept = api._REPEATS.recent
    api._REPEATS.recent = [entry]
    try:
        collectives.allreduce(x, out=out)
        if not ran:
            raise SystemExit("not a repeat: the bench no longer matches api.allreduce")
        entry.run = _nothing
        allreduce = collectives.allreduce
        t0 = time.perf_counter()
        for _ in range(args.calls):
            allreduce(x, out=out)
        per_call = (time.perf_counter() - t0) / max(args.calls, 1)
    finally:
        api._REPEATS.recent = kept
    print(f"{per_call * 1e9:.0f} ns per repeat ({'in place' if args.in_place else 'out of place'})")
    return per_call


if __name__ == "__main__":
    main()
