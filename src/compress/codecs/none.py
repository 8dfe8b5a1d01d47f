"""Identity codec: the raw array bytes, no compression.

How it works: the body is a byte copy of the input; decoding copies it back. It exists as the
baseline for benchmarks and as the "no compression" entry of the codec table.

Wire size: ``header + n * itemsize`` bytes, header ``= 16 + 8 * ndim``.

Properties: summable (the body is the array), unbiased, no error feedback needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._layout import Section
from ..base import Codec
from ..protocols import ElementSummable, decoded_into

__all__ = ["Identity"]


@dataclass(eq=False)
class Identity(ElementSummable, Codec):
    """Send the array unchanged."""

    name = "none"
    codec_id = 1
    unbiased = True

    def body_nbytes(self, n, dtype):
        return n * np.dtype(dtype).itemsize

    def _sections(self, n, dtype, params):
        return [Section("data", dtype, n)]

    def _encode(self, x, ops, key, step, out):
        buf, body = self._new_payload(x, out, {}, ops)
        ops.copy_into(body["data"], x.reshape(-1))
        return buf

    def _decode(self, hdr, body, ops):
        return ops.copy(body["data"])

    # summable protocol (see compress.base): the values themselves
    summable_add = np.add

    def summable_encode(self, x, *, key=None, step: int = 0) -> np.ndarray:
        return self._prepare_any(x).reshape(-1).copy()

    def summable_decode(self, rep, *, shape, dtype, key=None, step: int = 0,
                        out=None) -> np.ndarray:
        return decoded_into(rep.astype(dtype, copy=False).reshape(shape), out, shape)
