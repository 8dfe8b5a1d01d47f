"""Fitting the cost model's alpha, beta and gamma from measurements on this machine.

- alpha, beta: one-way ping-pong times ``t(n) = alpha + n beta`` between two ranks (what
  ``osu_latency`` measures), :func:`fit_alpha_beta`: beta is the slope through the sizes of at
  least 1 MiB (where bandwidth decides: a token bucket's burst, which lets the first few hundred
  kB of a shaped link through at once, or a cache no longer flatters it), alpha what is left of
  the small messages' times. (A least-squares fit on the relative error of every size would let
  the burst make 64 KiB and 1 MiB look fast and overestimate a shaped link's rate;
  docs/benchmarks.md, "Numbers behind the code".) On a cluster: between two ranks of one node
  (alpha, beta) and between rank 0 and a rank of another node (alpha_inter, beta_inter: one flow
  over the network, the others idle).
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

from ...selection.cost_model import Network

__all__ = ["fit_line", "fit_alpha_beta", "fit_network", "measure_pingpong", "measure_reduction",
           "LARGE_BYTES"]

#: sizes from here up fix beta (:func:`fit_alpha_beta`)
LARGE_BYTES = 1 << 20


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


def fit_alpha_beta(times: dict[int, float]) -> tuple[float, float]:
    """(alpha, beta) from one-way times by message size in bytes.

    beta: the least-squares slope through the sizes >= :data:`LARGE_BYTES` (at least two of
    them; otherwise :func:`fit_line` over every size decides both); alpha: ``t - n beta`` of the
    smallest size. Both clipped at 0.
    """
    large = sorted(n for n in times if n >= LARGE_BYTES)
    if len(large) < 2:
        return fit_line(list(times), list(times.values()))
    xs = np.asarray(large, float)
    ys = np.asarray([times[n] for n in large], float)
    beta = max(float(np.polyfit(xs, ys, 1)[0]), 0.0)
    smallest = min(times)
    return max(times[smallest] - smallest * beta, 0.0), beta


def fit_network(pingpong: dict[int, float], reduction: dict[int, float],
                native_small: tuple[float, int] | None = None,
                inter_pingpong: dict[int, float] | None = None, **settings) -> Network:
    """A :class:`Network` from ping-pong and reduction times (seconds by size in bytes).

    ``native_small`` = (seconds, p) of the smallest native allreduce, for ``alpha_native``.
    ``inter_pingpong``: ping-pong times between nodes, for ``alpha_inter`` and ``beta_inter``.
    ``settings`` pass on to :class:`Network` (``segment_bytes``, ``node_size``, ...).
    """
    alpha, beta = fit_alpha_beta(pingpong)
    if inter_pingpong is not None:
        settings["alpha_inter"], settings["beta_inter"] = fit_alpha_beta(inter_pingpong)
    _, gamma = fit_line(list(reduction), list(reduction.values()))
    alpha_native = None
    if native_small is not None:
        seconds, p = native_small
        alpha_native = seconds / max(1, (p - 1).bit_length())
    return Network(alpha=alpha, beta=beta, gamma=gamma, alpha_native=alpha_native, **settings)


def measure_pingpong(comm: MPI.Comm, sizes: Sequence[int], iterations: int = 50,
                     peer: int = 1) -> dict[int, float]:
    """One-way seconds between ranks 0 and ``peer`` for each size (fewer iterations above
    1 MiB; the others wait); the same dict on every rank (collective)."""
    from ..osu.latency import pingpong  # the osu_latency loop
    from ..osu.pairs import pair_comm

    pair = pair_comm(comm, 0, peer)
    times = {}
    for size in sizes:
        iters = iterations if size <= 1 << 20 else max(3, iterations // 10)
        buf, back = np.ones(size, np.uint8), np.empty(size, np.uint8)
        comm.Barrier()
        us = pingpong(pair, buf, back, iters, 2) if pair != MPI.COMM_NULL else 0.0
        times[size] = comm.bcast(us, root=0) * 1e-6
    if pair != MPI.COMM_NULL:
        pair.Free()
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
