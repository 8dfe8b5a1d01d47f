"""Tensor fusion: many layer tensors living in one flat buffer (Horovod's fusion buffer).

Horovod packs the gradients of many small layers into one buffer so that one large allreduce
replaces many small ones, paying the per-message latency once. Here the buffer is the storage
itself: :class:`FusionBuffer` allocates one contiguous array and hands out each tensor as a
*view* into it, so the model writes its gradients straight into the buffer and packing costs
nothing. :meth:`FusionBuffer.pack` and :meth:`FusionBuffer.unpack` copy to and from separate
arrays for callers that keep their own. A buffer made with ``allocate=False`` is its layout
only (shapes, offsets, size: ``flat`` and ``views`` are None), for a model whose tensors live
elsewhere (sharded training keeps slices of them).
"""

from __future__ import annotations

from math import prod
from typing import Sequence

import numpy as np

__all__ = ["FusionBuffer"]


class FusionBuffer:
    """One flat array holding tensors of the given ``shapes`` back to back.

    Parameters
    ----------
    shapes
        Shape of every tensor, in order.
    dtype
        Element type of the buffer.
    allocate
        False: the layout only, no storage (``flat`` and ``views`` None).
    """

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtype=np.float32,
                 allocate: bool = True) -> None:
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        sizes = [prod(s) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()
        self.flat = np.zeros(self.offsets[-1], dtype=dtype) if allocate else None
        self.views = None if not allocate else [
            self.flat[a:b].reshape(s) for a, b, s in zip(self.offsets, self.offsets[1:],
                                                         self.shapes)]

    @property
    def size(self) -> int:
        return int(self.offsets[-1])

    def pack(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """Copy ``arrays`` (one per shape) into the buffer; return the flat buffer."""
        if len(arrays) != len(self.views):
            raise ValueError(f"expected {len(self.views)} arrays, got {len(arrays)}")
        for view, a in zip(self.views, arrays):
            view[...] = a
        return self.flat

    def unpack(self) -> list[np.ndarray]:
        """Copies of the tensors, in order."""
        return [v.copy() for v in self.views]
