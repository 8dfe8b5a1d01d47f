"""What reading the ``COLLECTIVES_*`` variables costs per call: ``Options.from_env()`` runs on every
collective called without ``options=``.

Side by side, interleaved, in one process: the C library's ``getenv`` through ctypes that
``collectives.options`` uses on POSIX, the public ``os.environb`` (what it used before) and
``os.environ`` (str keys) mappings, CPython's private ``os.environ._data`` (used before that;
for comparison only), and, for scale, a whole ``Options.from_env()`` and a
whole ``collectives.allreduce`` of 8 floats on ``COMM_SELF``. Medians of ``--repeats`` rounds of
``--number`` calls, in nanoseconds per call.

    python bench/options_env.py [--repeats 15] [--number 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import timeit

import numpy as np
from mpi4py import MPI

import collectives
from collectives.options import ENV, Options, raw_values

_STR = tuple(ENV.values())
_BYTES = tuple(os.fsencode(name) for name in _STR)


def _private() -> tuple:  # an earlier implementation, for comparison only
    return tuple(os.environ._data.get(name) for name in _BYTES)


def _environb() -> tuple:
    return tuple(map(os.environb.get, _BYTES))


def _environ() -> tuple:
    return tuple(map(os.environ.get, _STR))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--number", type=int, default=20000)
    args = p.parse_args(argv)
    x = np.ones(8, np.float32)
    cases = {
        "C getenv (now)": raw_values,
        "os.environb (before)": _environb,
        "os.environ": _environ,
        "os.environ._data (private)": _private,
        "Options.from_env()": Options.from_env,
        "allreduce(8 floats, COMM_SELF)": lambda: collectives.allreduce(x, comm=MPI.COMM_SELF),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            samples[name].append(timeit.timeit(fn, number=args.number) / args.number * 1e9)
    print(f"ns per call, median of {args.repeats} x {args.number} (interleaved); "
          f"{sum(v in os.environ for v in _STR)} of the {len(_STR)} variables set")
    med = {name: statistics.median(s) for name, s in samples.items()}
    for name, ns in med.items():
        print(f"{name:<32} {ns:9.0f}")
    now, before = med["C getenv (now)"], med["os.environb (before)"]
    print(f"os.environb / C getenv: {before / now:.1f}x; "
          f"C getenv / private dict: {now / med['os.environ._data (private)']:.1f}x")


if __name__ == "__main__":
    import sys

    from collectives.tools import program

    sys.exit(program("options_env", main)())
