"""The remembered allreduce's own work per repeat: finding the entry and re-checking the arrays.

``python bench/repeat_lookup.py --calls N [--in-place] [--torch]``

Calls ``collectives.allreduce(x, out=...)`` ``N`` times with one remembered entry of 8 B of
float32 in the library's cache of remembered calls (``collectives._runtime.repeats.REPEATS``)
whose run is a no-op, so what is left is the public call's repeat path: the lookup (weak
references, names), the options argument and the re-checks of what can change in place. No MPI
call is made. ``--torch``: the arrays are PyTorch CPU tensors (the entry keeps views of their
memory). Meant for counting instructions, which no other job on the machine moves, as the
difference of two runs::

    export OPENBLAS_NUM_THREADS=1   # OpenBLAS's idle threads spin inside the count otherwise
    for n in 0 20000; do
      valgrind --tool=callgrind --callgrind-out-file=/dev/null python bench/repeat_lookup.py \\
          --calls $n [--in-place] [--torch] 2>&1 | grep Collected
    done   # (second - first) / 20000: instructions per repeat

Without valgrind it prints the mean time per repeat (a noisy machine moves it).
"""

from __future__ import annotations

import argparse
import time
import types
from typing import Any

import numpy as np

import collectives
from collectives import api
from collectives._runtime.arrays import check_input, flat
from collectives._runtime.repeats import REPEATS, Repeat, kind_of
from collectives.options import Options


def _nothing(*args: Any, **kwargs: Any) -> None:
    """The entry's run in the timed calls."""


def _entry(x: Any, out: Any, run: Any) -> api._Repeat:
    """A remembered blocking allreduce of ``x`` into ``out`` as ``api.allreduce`` makes one,
    with ``run`` as its run (no context, no algorithm: nothing is sent)."""
    src = flat(check_input(x))
    dst = src if out is x else flat(check_input(out))
    call = types.SimpleNamespace(src=x if src is x else src, dst=out if dst is out else dst,
                                 opts=Options.from_env())
    entry = api._Repeat.__new__(api._Repeat)
    Repeat.__init__(entry, "allreduce", call, x, out, "sum", "auto", None, None,
                    types.SimpleNamespace(live=True), kind_of(x), kind_of(out))
    entry.run, entry.fn, entry.reduction, entry.what = run, None, None, None
    return entry


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--in-place", action="store_true", help="allreduce(x, out=x)")
    ap.add_argument("--torch", action="store_true", help="PyTorch CPU tensors")
    args = ap.parse_args(argv)
    if args.torch:
        import torch

        x = torch.ones(2, dtype=torch.float32)
        out = x if args.in_place else torch.ones(2, dtype=torch.float32)
    else:
        x = np.ones(2, np.float32)
        out = x if args.in_place else np.ones(2, np.float32)
    ran = []
    entry = _entry(x, out, lambda *args, **kwargs: ran.append(1))  # one call: is it a repeat?
    kept = REPEATS.recent
    REPEATS.recent = [entry]
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
        REPEATS.recent = kept
    print(f"{per_call * 1e9:.0f} ns per repeat ({'in place' if args.in_place else 'out of place'}"
          f"{', torch' if args.torch else ''})")
    return per_call


if __name__ == "__main__":
    main()
