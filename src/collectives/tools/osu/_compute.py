"""The "dummy compute" of the non-blocking benchmarks, in three kinds.

OSU's ``osu_iallreduce`` overlaps the collective with ``compute_on_host``: a 25 x 25 loop of
multiply-adds in C, repeated until the target time has passed. Here:

- ``cpu``: the same loop as a Numba kernel that releases the GIL, run once for a calibrated
  number of repetitions: CPU-bound compute that needs a core but not the interpreter (as NumPy
  or PyTorch kernels do);
- ``sleep``: ``time.sleep``: compute that needs neither (work running on a GPU);
- ``python``: a pure-Python loop, holding the GIL between bytecodes: the worst case for a
  progress thread written in Python.

With ``probes`` > 0 the compute is cut into that many pieces with a ``test()`` of the request
after each (OSU's ``-t``). Kernels are kept here, apart from the benchmark's logic, with their
njit options in one constant; Numba is imported at the first ``cpu`` compute.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Callable

import numpy as np

__all__ = ["COMPUTE", "NJIT", "DIM", "prepare"]

NJIT = dict(cache=True, nogil=True)
DIM = 25  # OSU's matrix dimension


@lru_cache(maxsize=None)
def _kernel() -> Callable:
    from numba import njit

    @njit(**NJIT)
    def compute_on_host(a, x, y, reps):  # pragma: no cover - compiled
        for _ in range(reps):
            for i in range(a.shape[0]):
                for j in range(a.shape[0]):
                    x[i] = x[i] + a[i, j] * a[j, i] + y[j]
        return x[0]

    return compute_on_host


@lru_cache(maxsize=None)
def _calibrated() -> tuple[Callable[[int], float], float]:
    """(kernel of ``reps``, seconds per repetition), measured once on this core."""
    a = np.full((DIM, DIM), 2.0, dtype=np.float32)
    x, y = np.ones(DIM, dtype=np.float32), np.ones(DIM, dtype=np.float32)
    kernel = _kernel()

    def run(reps: int) -> float:
        x[:] = 1.0  # keep the values finite
        return kernel(a, x, y, reps)

    run(10)  # compile
    reps, elapsed = 1000, 0.0
    while elapsed < 0.05:
        reps *= 2
        start = time.perf_counter()
        run(reps)
        elapsed = time.perf_counter() - start
    return run, elapsed / reps


def _cpu(seconds: float) -> None:
    run, per_rep = _calibrated()
    run(max(1, int(seconds / per_rep)))


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _python(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 1.0
    while time.perf_counter() < end:
        for _ in range(100):
            x = x * 1.0000001 + 1e-9


#: Compute kind -> ``compute(seconds)``.
COMPUTE: dict[str, Callable[[float], None]] = {"cpu": _cpu, "sleep": _sleep, "python": _python}


def prepare(kind: str) -> None:
    """Compile and calibrate before any timing (``cpu``)."""
    if kind == "cpu":
        _calibrated()
