"""OSU's timing method, for one or several calls interleaved in the same loop.

Each call is timed alone (``perf_counter`` around the call) and followed by an untimed barrier,
so no call starts before every rank has finished the previous one. Each rank averages its own
times; the reported min, average and max are taken across ranks of those per-rank means (as
``osu_allreduce`` does). Several calls (one per algorithm) run in turn inside every iteration,
so slow drift of a shared machine hits every column alike. The per-rank median, averaged over
ranks, is kept too: on a noisy machine it is the steadier number to compare algorithms by.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
from mpi4py import MPI

__all__ = ["Stat", "time_interleaved"]


@dataclass(frozen=True)
class Stat:
    """Latency of one call in microseconds, across ranks."""

    avg: float
    min: float
    max: float
    median: float
    iterations: int


def time_interleaved(calls: Mapping[str, Callable[[], object]], iterations: int, warmup: int,
                     comm: MPI.Comm) -> dict[str, Stat]:
    """Time every call of ``calls`` ``iterations`` times after ``warmup`` untimed rounds."""
    names = list(calls)
    samples = np.zeros((len(names), max(iterations, 1)))
    for it in range(warmup + iterations):
        for k, name in enumerate(names):
            start = time.perf_counter()
            calls[name]()
            elapsed = time.perf_counter() - start
            comm.Barrier()
            if it >= warmup:
                samples[k, it - warmup] = elapsed
    mean = samples.mean(axis=1) * 1e6
    median = np.median(samples, axis=1) * 1e6
    lo, hi, total, med = (np.empty_like(mean) for _ in range(4))
    comm.Allreduce(mean, lo, op=MPI.MIN)
    comm.Allreduce(mean, hi, op=MPI.MAX)
    comm.Allreduce(mean, total, op=MPI.SUM)
    comm.Allreduce(median, med, op=MPI.SUM)
    p = comm.size
    return {name: Stat(float(total[k] / p), float(lo[k]), float(hi[k]), float(med[k] / p),
                       iterations) for k, name in enumerate(names)}
