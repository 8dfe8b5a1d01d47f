"""bfloat16 codec (the upper 16 bits of float32, rounded).

How it works: float32 words are rounded to nearest-even on bit 16
(:func:`compress._kernels.floats.f32_to_bf16_bits`), NaN stays a quiet NaN. float64 and float16
input is first converted to float32 (for float64 this rounds twice, an error below one bf16 ulp).
Decoding shifts the 16 bits back up, which is exact. Format: Kalamkar et al., "A Study of BFLOAT16
for Deep Learning Training", 2019.

Wire size: ``header + 2 * n`` bytes, header ``= 16 + 8 * ndim``.

Properties: summable, deterministic (not unbiased), no error feedback needed. Same range as float32,
so no overflow when summing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._backends import backend_of
from ..bfloat16 import add_words
from ..protocols import decoded_into, writes_into
from ._words16 import Words16

__all__ = ["BF16"]


@dataclass(eq=False)
class BF16(Words16):
    """Round to bfloat16."""

    name = "bf16"
    codec_id = 3
    SECTION = "bf16"

    def _words(self, ops, x, words):
        ops.to_bf16(ops.astype(x, np.float32), words)

    def _widen(self, ops, words, out):
        ops.bf16_to_f32(words, out)

    # summable protocol (compress.protocols.ElementSummable): bf16 words, added by add_words
    summable_add = staticmethod(add_words)

    def summable_decode(self, rep, *, shape, dtype, key=None, step: int = 0,
                        out=None) -> np.ndarray:
        ops = backend_of(rep)
        if np.dtype(dtype) == np.float32 and writes_into(out, np.float32):
            ops.bf16_to_f32(rep, out.reshape(-1))
            return out.reshape(shape)
        f32 = ops.empty(rep.size, np.float32)
        ops.bf16_to_f32(rep, f32)
        return decoded_into(f32.astype(dtype, copy=False).reshape(shape), out, shape)
