"""Fitting the cost model's alpha, beta and gamma from measurements on this machine.

(``collectives.tuning.fit``; was ``collectives.fit``.)

- alpha, beta: one-way ping-pong times ``t(n) = alpha + n beta`` between ranks 0 and 1 (what
  ``osu_latency`` measures), fitted by least squares on the *relative* error, so the
  microsecond-scale small messages fix alpha as firmly as the large ones fix beta.
- gamma: the time of ``np.add(a, b, out=a)`` on ``n`` bytes, ``t(n) = c + n gamma``.
- alpha_native: the smallest measured ``MPI_Allreduce`` time over ``lg p`` (MPI's C path pays
  no Python per message), when the tuning sweep has it.

The pure fitting (:func:`fit_line`, :func:`fit_network`) needs no MPI; :func:`measure_pingpong`
and :func:`measure_reduction` take the measurements.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
from mpi4py import MPI

from .cost_model import Network

__all__ = ["fit_line", "fit_network", "measure_pingpong", "measure_reduction"]


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of ``y = intercept + slope x`` minimising the relative squared error.

    Both are clipped at 0 (a negative latency or bandwidth cost is noise).
    """
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    if xs.shape != ys.shape or xs.size < 2:
        raise ValueError("fit_line needs two equally long sequences of at least 2 points")
    if (ys <= 0).any():
        raise ValueError("times must be positive")
    design = np.stack([np.ones_like(xs), xs], axis=1) / ys[:, None]
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(ys), rcond=None)
    return max(float(a), 0.0), max(float(b), 0.0)


def fit_network(pingpong: dict[int, float], reduction: dict[int, float],
                native_small: tuple[float, int] | None = None, **settings) -> Network:
    """A :class:`Network` from ping-pong and reduction times (seconds by size in bytes).

    ``native_small`` = (seconds, p) of the smallest native allreduce, for ``alpha_native``.
    ``settings`` pass on to :class:`Network` (``segment_bytes``, ``node_size``, ...).
    """
    alpha, beta = fit_line(list(pingpong), list(pingpong.values()))
    _, gamma = fit_line(list(reduction), list(reduction.values()))
    alpha_native = None
    if native_small is not None:
        seconds, p = native_small
        alpha_native = seconds / max(1, (p - 1).bit_length())
    return Network(alpha=alpha, beta=beta, gamma=gamma, alpha_native=alpha_native, **settings)


def measure_pingpong(comm: MPI.Comm, sizes: Sequence[int], iterations: int = 50) -> dict[int, float]:
    """One-way seconds between ranks 0 and 1 for each size (fewer iterations above 1 MiB);
    the same dict on every rank."""
    from ..bench.latency import pingpong  # the osu_latency loop

    times = {}
    for size in sizes:
        iters = iterations if size <= 1 << 20 else max(3, iterations // 10)
        buf, back = np.ones(size, np.uint8), np.empty(size, np.uint8)
        comm.Barrier()
        us = pingpong(comm, buf, back, iters, 2) if comm.rank < 2 else 0.0
        times[size] = comm.bcast(us, root=0) * 1e-6
    return times


def measure_reduction(sizes: Sequence[int], repeats: int = 7) -> dict[int, float]:
    """Median seconds of ``np.add(a, b, out=a)`` on float32 arrays of each size in bytes."""
    times = {}
    for size in sizes:
        a = np.ones(max(size // 4, 1), np.float32)
        b = np.ones_like(a)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            np.add(a, b, out=a)
            samples.append(time.perf_counter() - start)
        times[a.nbytes] = float(np.median(samples))
    return times
