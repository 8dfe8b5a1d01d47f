"""One compressed allreduce call, as the strategies see it: state, key, step and aggregation.

A ``TensorCoding`` holds the call's :class:`~collectives.compressed.state.CompressionState` (the
codec, the memory that adds residuals back before encoding, the server-side memory) and fixes how
decoded contributions combine: their sum, their mean, or, for codecs whose ``aggregation`` is
"majority" (signSGD), the sign of their sum. Aggregation runs in rank order, so every rank that
aggregates the same contributions gets the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from compress import Codec

from .._runtime.arrays import xp
from .state import CompressionState

__all__ = ["TensorCoding"]


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
        whole = x.reshape(self.shape) if part is None else x
        return self.state.encoder.encode(whole, key=self.subkey(part), step=self.step)

    def subkey(self, part: int | None) -> Any:
        return self.key if part is None else f"{self.key}#chunk{part}"

    def decode(self, payload: np.ndarray, count: int) -> np.ndarray:
        """Dense flat contents of a payload that must hold ``count`` elements (payloads come
        from other ranks: a wrong count is rejected before the decoder allocates anything)."""
        return self.codec.decode(payload, count=count).reshape(-1)

    def finish(self, acc: np.ndarray, count: int, out: np.ndarray) -> None:
        """Turn a rank-order sum of ``count`` contributions into the result, written to ``out``
        (a host ``acc`` goes to a device ``out`` in one copy)."""
        if self.majority:
            np.sign(acc, out=acc)
        elif self.average:
            acc /= count
        out[...] = xp(out).asarray(acc)

    def aggregate_into(self, decoded: Sequence[np.ndarray], out: np.ndarray) -> None:
        """Combine contributions (rank order) into ``out``; mean over ``world`` when averaging."""
        acc = decoded[0].astype(np.result_type(decoded[0].dtype, np.float32), copy=True)
        for d in decoded[1:]:
            acc += d
        self.finish(acc, self.world, out)
