"""What calling a Numba kernel costs before it runs: the dispatcher against the compiled entry.

``python bench/numba_dispatch.py [--calls 200000] [--repeats 7]``

A compiled function with an empty body and the ten arguments of the shared-memory round driver
(``_runtime/shmem/kernels/rounds.py``'s ``run_rounds``: an int64 table, a 2-D int64 table, three
float32 arrays, five integers), and one with a single array, called

- through the dispatcher (``f(...)``), which types every argument at every call to pick the
  compiled version (Numba's ``typeof`` of each), as every kernel call of the library does;
- through the compiled version's entry (``f.overloads[sig].entry_point``), which only unboxes
  the arguments: what ``shm.Lane`` calls for repeated calls (``Team.run_compiled``).

Printed: the best over ``--repeats`` of the mean ns per call. No MPI.
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
from numba import njit


@njit(cache=False)
def ten(tab, regions, x, out, token, op, mode, m, seq, kind):  # pragma: no cover - compiled
    return 0


@njit(cache=False)
def one(tab):  # pragma: no cover - compiled
    return 0


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    tab = np.zeros(64, np.int64)
    regions = np.zeros((1, 3), np.int64)
    x, out = np.ones(2, np.float32), np.ones(2, np.float32)
    cases = {
        "dispatcher, 10 arguments": (ten, (tab, regions, x, out, out, 0, 1, 1, 7, 9)),
        "dispatcher, 1 array": (one, (tab,)),
    }
    for name, (fn, fargs) in list(cases.items()):
        fn(*fargs)  # compiled now
        entry = fn.overloads[fn.signatures[0]].entry_point
        cases[name.replace("dispatcher", "entry")] = (entry, fargs)
    results = {}
    for name, (fn, fargs) in cases.items():
        best = min(timeit.repeat(lambda: fn(*fargs), number=args.calls, repeat=args.repeats))
        results[name] = best / args.calls * 1e9
        print(f"{name:28s} {results[name]:7.1f} ns")
    return results


if __name__ == "__main__":
    main()
