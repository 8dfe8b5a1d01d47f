"""IEEE half-precision (binary16) codec.

How it works: every element is rounded to the nearest binary16 value (ties to even; overflow to
infinity, NaN stays NaN). float32 input goes through an integer-only Numba kernel
(:func:`compress._kernels.floats.f32_to_f16_bits`, checked bit-exact against NumPy's cast over all 2**32
inputs); float64 input uses NumPy's correctly rounded cast; float16 input is copied. Decoding widens
through a 65536-entry lookup table. Mixed-precision training as in Micikevicius et al., "Mixed
Precision Training", ICLR 2018.

Wire size: ``header + 2 * n`` bytes, header ``= 16 + 8 * ndim``.

Properties: summable (fp16 values add in an allreduce; scale by 1/p before summing to avoid overflow),
deterministic rounding so not unbiased, no error feedback needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._kernels.floats import f32_to_f16_bits, table_lookup
from .._device import Device, is_device
from .._layout import Section
from ..base import Codec

__all__ = ["FP16"]

_F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@dataclass(eq=False)
class FP16(Codec):
    """Round to IEEE binary16."""

    name = "fp16"
    codec_id = 2
    summable = True

    def body_nbytes(self, n, dtype):
        return 2 * n

    def _sections(self, n, dtype, params):
        return [Section("half", np.uint16, n)]

    def _encode(self, x, key, step, out):
        buf, body = self._new_payload(x, out, {})
        flat = x.reshape(-1)
        if x.dtype == np.float32:
            f32_to_f16_bits(flat.view(np.uint32), body["half"])
        else:
            body["half"].view(np.float16)[:] = flat
        return buf

    def _encode_device(self, x, dev, key, step, out):
        buf, body = self._new_payload(x, out, {}, dev=dev)
        self._body_device(x.reshape(-1), dev, body["half"])
        return buf

    @staticmethod
    def _body_device(flat, dev, half=None):
        """Binary16 words of the flat device array ``flat`` (into ``half`` if given)."""
        from .._kernels.cuda import blocks, elementwise

        half = dev.empty(flat.size, np.uint16) if half is None else half
        if flat.dtype == np.float16:
            dev.copy_into(half, flat.view(np.uint16))
        elif flat.size:
            mbits, bias, word = (23, 127, np.uint32) if flat.dtype == np.float32 else (52, 1023, np.uint64)
            dev.launch(elementwise.to_f16, blocks(flat.size), flat.view(word), mbits, bias, half)
        return half

    def _decode_device(self, hdr, body, dev):
        from .._kernels.cuda import blocks, elementwise

        half = body["half"]
        if hdr.dtype == np.float16:
            return dev.copy(half).view(np.float16)
        out = dev.empty(hdr.count, np.float32)
        if hdr.count:
            dev.launch(elementwise.f16_to_f32, blocks(hdr.count), half, out.view(np.uint32))
        return dev.astype(out, hdr.dtype)

    # summable protocol (see compress.base): binary16 values, added in binary16
    summable_add = np.add

    def summable_encode(self, x, *, key=None, step: int = 0) -> np.ndarray:
        x = self._prepare_any(x).reshape(-1)
        if is_device(x):  # the payload body, made on the device, is the representation
            return self._body_device(x, Device(x)).view(np.float16)
        half = np.empty(x.size, dtype=np.uint16)
        if x.dtype == np.float32:
            f32_to_f16_bits(x.view(np.uint32), half)
        else:
            half.view(np.float16)[:] = x
        return half.view(np.float16)

    def summable_decode(self, rep, *, shape, dtype, key=None, step: int = 0) -> np.ndarray:
        return rep.astype(dtype).reshape(shape)

    def _decode(self, hdr, body):
        half = body["half"]
        if hdr.dtype == np.float16:
            return half.view(np.float16).copy()
        out = np.empty(hdr.count, dtype=np.float32)
        table_lookup(half, _F16_TO_F32, out)
        return out if hdr.dtype == np.float32 else out.astype(hdr.dtype)
