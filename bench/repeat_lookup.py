"""The remembered allreduce's own work per repeat: finding the entry and re-checking the arrays.

``python bench/repeat_lookup.py --calls N [--in-place]``

Runs ``collectives.api._Repeats.run`` ``N`` times on one remembered entry of 8 B of float32
whose run is a no-op, so what is left is the lookup (weak references, names), the options in
force and the re-checks of what can change in place. No MPI call is made. Meant for counting
instructions, which no other job on the machine moves, as the difference of two runs::

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

import numpy as np
from mpi4py import MPI

from collectives.api import _Repeats
from collectives.options import Options


def _entry(x: np.ndarray, out: np.ndarray) -> types.SimpleNamespace:
    """What ``api._Repeat`` keeps that ``_Repeats.run`` reads, with a run that does nothing."""
    return types.SimpleNamespace(
        x=weakref.ref(x), out=weakref.ref(out), opname="sum", algorithm="auto", comm_arg=None,
        comm=MPI.COMM_WORLD,
        shape=x.shape, xstrides=x.strides, ostrides=out.strides, dtype=x.dtype,
        opts=Options.from_env(), ctx=types.SimpleNamespace(live=True),
        run=lambda *args, **kwargs: None, vector=True, inplace=out is x, op=None, fn=None,
        what=None)


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--in-place", action="store_true", help="allreduce(x, out=x)")
    args = ap.parse_args(argv)
    x = np.ones(2, np.float32)
    out = x if args.in_place else np.ones(2, np.float32)
    repeats = _Repeats()
    repeats.recent = [_entry(x, out)]
    t0 = time.perf_counter()
    for _ in range(args.calls):
        if not repeats.run(x, out, "sum", "auto", None, None):
            raise SystemExit("not a repeat: the bench no longer matches _Repeats.run")
    per_call = (time.perf_counter() - t0) / max(args.calls, 1)
    print(f"{per_call * 1e9:.0f} ns per repeat ({'in place' if args.in_place else 'out of place'})")
    return per_call


if __name__ == "__main__":
    main()
