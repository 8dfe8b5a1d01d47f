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

from .._kernels.floats import bf16_bits_to_f32, f32_to_bf16_bits
from .._device import Device, is_device, namespace
from .._layout import Section
from ..base import Codec

__all__ = ["BF16", "add_words"]


def add_words(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """bfloat16 addition on raw uint16 words: widen to float32 (exact), add, round to nearest even.

    The summable protocol's combine for bf16 (NumPy's calling convention ``f(a, b, out=)``), for
    host or CuPy arrays.
    """
    total = (a.astype(np.uint32) << 16).view(np.float32) + (b.astype(np.uint32) << 16).view(np.float32)
    _round_words(total, out)


def _round_words(f32, words) -> None:
    """bfloat16 words ``words`` of the flat float32 array ``f32`` (host or device)."""
    if not is_device(f32):
        f32_to_bf16_bits(f32.view(np.uint32), words)
    elif f32.size:
        from .._kernels.cuda import blocks, elementwise

        Device(f32).launch(elementwise.to_bf16, blocks(f32.size), f32.view(np.uint32), words)


def _widen_words(words, f32) -> None:
    """Float32 values ``f32`` of the bfloat16 words ``words`` (host or device); exact."""
    if not is_device(words):
        bf16_bits_to_f32(words, f32.view(np.uint32))
    elif words.size:
        from .._kernels.cuda import blocks, elementwise

        Device(words).launch(elementwise.bf16_to_f32, blocks(words.size), words, f32.view(np.uint32))


@dataclass(eq=False)
class BF16(Codec):
    """Round to bfloat16."""

    name = "bf16"
    codec_id = 3
    summable = True

    def body_nbytes(self, n, dtype):
        return 2 * n

    def _sections(self, n, dtype, params):
        return [Section("bf16", np.uint16, n)]

    def _encode(self, x, key, step, out):
        buf, body = self._new_payload(x, out, {})
        f32 = x.reshape(-1).astype(np.float32, copy=False)
        f32_to_bf16_bits(f32.view(np.uint32), body["bf16"])
        return buf

    # summable protocol (see compress.base): bf16 words, added by add_words
    summable_add = staticmethod(add_words)

    def summable_encode(self, x, *, key=None, step: int = 0) -> np.ndarray:
        f32 = self._prepare_any(x).reshape(-1).astype(np.float32, copy=False)
        words = namespace(f32).empty(f32.size, dtype=np.uint16)
        _round_words(f32, words)
        return words

    def summable_decode(self, rep, *, shape, dtype, key=None, step: int = 0) -> np.ndarray:
        out = namespace(rep).empty(rep.size, dtype=np.float32)
        _widen_words(rep, out)
        return out.astype(dtype, copy=False).reshape(shape)

    def _encode_device(self, x, dev, key, step, out):
        buf, body = self._new_payload(x, out, {}, dev=dev)
        _round_words(dev.astype(x.reshape(-1), np.float32), body["bf16"])
        return buf

    def _decode_device(self, hdr, body, dev):
        out = dev.empty(hdr.count, np.float32)
        _widen_words(body["bf16"], out)
        return dev.astype(out, hdr.dtype)

    def _decode(self, hdr, body):
        out = np.empty(hdr.count, dtype=np.float32)
        bf16_bits_to_f32(body["bf16"], out.view(np.uint32))
        return out if hdr.dtype == np.float32 else out.astype(hdr.dtype)
