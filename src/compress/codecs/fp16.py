"""IEEE half-precision (binary16) codec.

How it works: every element is rounded to the nearest binary16 value (ties to even; overflow to
infinity, NaN to the quiet NaN ``0x7E00`` with its sign). float32 input goes through a Numba
kernel of the processor's conversion (:func:`compress._kernels.floats.f32_to_f16_bits`: the
words of NumPy's cast for every non-NaN input, and of the integer-only twin the device runs for
every input); float64 input uses NumPy's correctly rounded cast; float16 input is copied.
Decoding widens with the processor's conversion too, with NumPy's bits (NaN payloads kept).
Mixed-precision training as in Micikevicius et al., "Mixed Precision Training", ICLR 2018.

Wire size: ``header + 2 * n`` bytes, header ``= 16 + 8 * ndim``.

Properties: summable (fp16 values add in an allreduce; scale by 1/p before summing to avoid overflow),
deterministic rounding so not unbiased, no error feedback needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._backends import backend_of
from ..protocols import decoded_into, writes_into
from ._words16 import Words16

__all__ = ["FP16"]


@dataclass(eq=False)
class FP16(Words16):
    """Round to IEEE binary16."""

    name = "fp16"
    codec_id = 2
    SECTION = "half"

    def _words(self, ops, x, words):
        ops.to_f16(x, words)

    def _rep(self, words):
        return words.view(np.float16)

    def _decode(self, hdr, body, ops):
        if hdr.dtype == np.float16:
            return ops.copy(body["half"]).view(np.float16)
        return super()._decode(hdr, body, ops)

    def _widen(self, ops, words, out):
        ops.f16_to_f32(words, out)

    # summable protocol (compress.protocols.ElementSummable): binary16 values, added in binary16
    summable_add = np.add

    def summable_decode(self, rep, *, shape, dtype, key=None, step: int = 0,
                        out=None) -> np.ndarray:
        """The summed binary16 values as ``dtype`` (float32 through the decode's kernel: NumPy's
        cast, exactly, without its per-element software conversion), into ``out`` if given."""
        if np.dtype(dtype) != np.float32 or rep.dtype != np.float16 or rep.ndim != 1:
            return decoded_into(rep.astype(dtype).reshape(shape), out, shape)
        ops = backend_of(rep)
        direct = writes_into(out, np.float32)
        dst = out.reshape(-1) if direct else ops.empty(rep.size, np.float32)
        ops.f16_to_f32(rep.view(np.uint16), dst)
        return dst.reshape(shape) if direct else decoded_into(dst.reshape(shape), out, shape)
