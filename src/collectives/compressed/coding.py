"""One compressed allreduce call, as the strategies see it: state, key, step and aggregation.

A ``TensorCoding`` holds the call's :class:`~collectives.compressed.state.CompressionState` (the
codec, the memory that adds residuals back before encoding, the server-side memory) and fixes how
decoded contributions combine: their sum, their mean, or, for codecs whose ``aggregation`` is
"majority" (signSGD), the sign of their sum. Aggregation runs in rank order, so every rank that
aggregates the same contributions gets the same bits.

:meth:`TensorCoding.aggregate_into` sums payloads without a dense vector per
contribution: sparse payloads (``compress.protocols.SparsePayload``) are added into the dense
result chunk by chunk, each chunk written once (``_kernels.sum_in_rank_order``, the bits of the
dense sum), others are decoded one at a time into a running sum.

Encoding, decoding and aggregating are observed at the point ``codec``
(``observe.py``: the timeline's "encode", "decode" and "aggregate" spans; a decode
inside an aggregation is observed too).

Public: a ``TensorCoding`` is the ``coding`` argument of every run function of
:data:`~collectives.compressed.strategies.STRATEGIES` (``fn(x, out, coding, ctx, opts,
algorithm)``), and ``TensorCoding(CompressionState(codec), key, step, average, world,
shape).aggregate_into(payloads, count, out)`` is the aggregation a compressed allreduce runs,
in one process (bench/codec_pipeline.py and :func:`.speed.measure_speed` time it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from compress import Codec
from compress.protocols import SparsePayload

from .._runtime.arrays import xp
from ..observe import OBSERVERS as _OBSERVED
from .state import CompressionState

__all__ = ["TensorCoding"]

_clock = time.perf_counter


def _observed(observers: tuple, phase: str, t0: float) -> None:
    """Tell the observers of ``codec`` of ``phase`` from ``t0`` to now."""
    t1 = _clock()
    for observe in observers:
        observe(phase, t0, t1)


@dataclass
class TensorCoding:
    """What a strategy needs to encode, decode and aggregate one tensor."""

    state: CompressionState
    key: Any
    step: int
    average: bool       # mean (op="avg") rather than sum
    world: int
    shape: tuple[int, ...] = ()  # the tensor's shape (strategies see it flat; PowerSGD needs it)

    @property
    def codec(self) -> Codec:
        return self.state.codec

    @property
    def majority(self) -> bool:
        return self.codec.aggregation == "majority"

    def encode(self, x: np.ndarray, part: int | None = None) -> np.ndarray:
        """Payload of flat ``x`` (through the state's memory, if any): the whole tensor (in its
        shape, so per-key state such as an error-feedback residual has the tensor's shape), or
        chunk ``part`` of it."""
        observers = _OBSERVED.codec
        t0 = _clock() if observers else 0.0
        try:
            whole = x.reshape(self.shape) if part is None else x
            return self.state.encoder.encode(whole, key=self.subkey(part), step=self.step)
        finally:
            if observers:
                _observed(observers, "encode", t0)

    def subkey(self, part: int | None) -> Any:
        return self.key if part is None else f"{self.key}#chunk{part}"

    def decode(self, payload: np.ndarray, count: int,
               out: np.ndarray | None = None) -> np.ndarray:
        """Dense flat contents of a payload that must hold ``count`` elements (payloads come
        from other ranks: a wrong count is rejected before the decoder allocates anything),
        written into ``out`` when given (flat, the payload's dtype)."""
        observers = _OBSERVED.codec
        t0 = _clock() if observers else 0.0
        try:
            return self.codec.decode(payload, count=count, out=out).reshape(-1)
        finally:
            if observers:
                _observed(observers, "decode", t0)

    def finish(self, acc: np.ndarray, count: int, out: np.ndarray) -> None:
        """Turn a rank-order sum of ``count`` contributions into the result, written to ``out``
        (a host ``acc`` goes to a device ``out`` in one copy; ``acc`` may be ``out`` itself)."""
        if self.majority:
            np.sign(acc, out=acc)
        elif self.average:
            acc /= count
        if acc is not out:
            out[...] = xp(out).asarray(acc)

    def accumulator(self, out: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """Where a sum in ``dtype`` goes: ``out`` itself when it is a contiguous host vector of
        that dtype (no second dense vector, no copy at the end), else a new array."""
        if type(out) is np.ndarray and out.dtype == dtype and out.ndim == 1 \
                and out.flags.c_contiguous and out.flags.writeable:
            return out
        return np.empty(out.size, dtype=dtype)

    def aggregate_into(self, payloads: Sequence[np.ndarray], count: int, out: np.ndarray) -> None:
        """Combine the decoded ``payloads`` (contributions in rank order, ``count`` elements each)
        into ``out``; mean over ``world`` when averaging. The sum is NumPy's ``acc = d_0`` (in at
        least float32), ``acc += d_r`` for each later rank, in one dense vector: host sparse
        payloads of one dtype are added into it at their indices (the same bits); any other
        payload is decoded and added, one at a time."""
        observers = _OBSERVED.codec
        t0 = _clock() if observers else 0.0
        try:
            if isinstance(self.codec, SparsePayload) \
                    and all(type(pl) is np.ndarray for pl in payloads):
                parts = [self.codec.sparse_views(pl, count=count) for pl in payloads]  # validated
                if len({vals.dtype for _, vals in parts}) == 1:
                    self._sparse_sum_into(parts, count, out)
                    return
            acc = None
            for pl in payloads:
                d = self.decode(pl, count)
                if acc is None:
                    acc = d.astype(np.result_type(d.dtype, np.float32), copy=True)
                else:
                    acc += d
            self.finish(acc, self.world, out)
        finally:
            if observers:
                _observed(observers, "aggregate", t0)

    def _sparse_sum_into(self, parts: list[tuple[np.ndarray, np.ndarray]], count: int,
                         out: np.ndarray) -> None:
        """The rank-order sum of validated (uint32 index, value) lists, as :meth:`aggregate_into`
        adds decoded payloads, and its mean: the dense result written once, in order (past the
        caches when it is large)."""
        from compress.stream import streaming

        from ._kernels import sum_in_rank_order  # Numba, on first use

        dtype = np.result_type(parts[0][1].dtype, np.float32)
        acc = self.accumulator(out, dtype)
        offsets = np.cumsum([0] + [idx.size for idx, _ in parts], dtype=np.int64)
        idx = np.concatenate([i for i, _ in parts])
        vals = np.concatenate([v for _, v in parts], dtype=dtype)
        average = self.average and not self.majority
        sum_in_rank_order(acc, idx, vals, offsets, dtype.type(self.world), average,
                          *streaming(acc))
        if self.majority:
            np.sign(acc, out=acc)
        if acc is not out:
            out[...] = xp(out).asarray(acc)
