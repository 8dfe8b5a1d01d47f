"""The codec pipeline's speed on this machine, as ``codec="auto:<spec>"`` reads it.

``collectives-tune`` runs :func:`measure_speed` on every rank at once (the ranks of a node encode
at the same time in training) and keeps the slowest rank's numbers in the tuning file's
``"codecs"`` section; :mod:`collectives.compressed.auto` reads them. What it times is the same
code a compressed allreduce runs (the memory's encode, ``TensorCoding.aggregate_into``);
``bench/codec_pipeline.py`` times every phase against a memory copy, for the docs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

import compress

from .coding import TensorCoding
from .auto import CodecSpeed
from .state import CompressionState

__all__ = ["measure_speed"]


def _median_s(fn, repeats: int) -> float:
    fn()  # once untimed: first-use allocations, kernels loaded
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _interleaved_s(first, second, repeats: int) -> tuple[float, float]:
    """Median seconds of ``first()`` and ``second()``, called alternately (a loaded machine's
    drift hits both alike: their difference is what is fitted)."""
    first()
    second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, into in ((first, times[0]), (second, times[1])):
            t = time.perf_counter()
            fn()
            into.append(time.perf_counter() - t)
    return statistics.median(times[0]), statistics.median(times[1])


def measure_speed(spec: str, count: int, ranks: int, repeats: int = 7) -> CodecSpeed:
    """The codec pipeline's speed for ``spec`` on ``count`` float32 elements, in this process
    (``collectives-tune`` runs it on every rank at once and keeps the slowest):

    - ``encode``: the steady-state encode through error feedback where the codec needs it (as
      a state made by ``codec="auto:<spec>"`` in training), a new input each step, per byte;
    - ``payload``: the slope of ``TensorCoding.aggregate_into`` (what the allgather and sparse
      strategies run) from 1 to ``max(ranks, 2)`` payloads, per payload byte added;
    - ``decode``: the 1-payload time less its payload part, per byte of the result.

    Each is the median of ``repeats`` after one untimed call (the 1- and p-payload sums
    interleaved); negative slopes (noise) are 0.
    """
    p = max(int(ranks), 2)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(count).astype(np.float32) for _ in range(p)]
    codec = compress.from_spec(spec)
    if codec.needs_error_feedback:
        encoder: Any = compress.ErrorFeedback(codec)
    else:
        encoder = codec
    step = [0]

    def encode() -> None:
        step[0] += 1
        encoder.encode(xs[step[0] % p], key="w", step=step[0])

    n = count * 4
    t_encode = _median_s(encode, repeats)
    payloads = [codec.encode(x, key="w", step=0) for x in xs]
    b = float(np.mean([pl.nbytes for pl in payloads]))
    coding = TensorCoding(CompressionState(codec), "w", 0, True, p, (count,))
    out = np.empty(count, np.float32)
    one, every = _interleaved_s(lambda: coding.aggregate_into(payloads[:1], count, out),
                                lambda: coding.aggregate_into(payloads, count, out), repeats)
    payload = max(0.0, (every - one) / ((p - 1) * b)) if b else 0.0
    decode = max(0.0, one - payload * b) / n
    return CodecSpeed(t_encode / n, decode, payload, "measured")
