"""Shared machinery of the bucketed level quantizers (QSGD, TernGrad, 8-bit) (private).

The input is cut into buckets of ``bucket`` elements. Each bucket stores a scale (float64 for float64
input, float32 otherwise): its L2 norm (QSGD) or its max magnitude (TernGrad, 8-bit). Each element
becomes a signed level ``q`` in ``[-s, s]`` (``s`` = ``levels``), ``x ~ q * scale / s``, rounded
stochastically (unbiased) or to nearest; the code ``q + s`` is packed with
``bits = bit_length(2 s)`` bits, LSB-first, one continuous stream. See
:mod:`compress._kernels.quant`.

Body: ``ceil(n / bucket)`` scales, then ``ceil(n * bits / 8)`` code bytes. Decoding rejects
negative or infinite scales, codes above ``2 s`` and nonzero padding bits.

Non-finite input: a bucket holding ``±inf`` or NaN (or whose L2 norm overflows the scale's type,
float32 for float16/float32 input, as fp16 overflows to infinity) is stored with scale NaN and every
code at level 0, so it decodes to NaN, and a loss scaler downstream sees the overflow. The NaN is the
canonical quiet NaN, written as an integer, so device payloads keep the host's bytes.
"""

from __future__ import annotations

import numpy as np

from ..header import MAX_COUNT
from .._layout import Section
from .._seeding import draw_stream, split_stream
from .._util import check_padding, require
from ..base import Codec

__all__ = ["LevelCodec", "level_bits", "MAX_LEVELS"]

MAX_LEVELS = (1 << 15) - 1


def level_bits(levels: int) -> int:
    """Bits per element for ``levels`` levels per sign: ``bit_length(2 * levels)``."""
    return (2 * int(levels)).bit_length()


def _scale_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


class LevelCodec(Codec):
    """Base of the level quantizers; subclasses set ``_use_max``, ``_stochastic`` and levels/bucket."""

    PARAMS = (("levels", "Q"), ("bucket", "Q"), ("stream", "Q"))
    _use_max = False
    _stochastic = True

    def _levels_bucket(self, n: int) -> tuple[int, int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def body_nbytes(self, n, dtype):
        s, bucket = self._levels_bucket(n)
        return -(-n // bucket) * _scale_dtype(dtype).itemsize + -(-n * level_bits(s) // 8)

    def _sections(self, n, dtype, params):
        s, bucket = params["levels"], params["bucket"]
        return [
            Section("scales", _scale_dtype(dtype), -(-n // bucket)),
            Section("codes", np.uint8, -(-n * level_bits(s) // 8)),
        ]

    def _check_params(self, hdr):
        s, bucket = hdr.params["levels"], hdr.params["bucket"]
        require(1 <= s <= MAX_LEVELS, f"levels {s} outside [1, {MAX_LEVELS}]")
        require(1 <= bucket <= MAX_COUNT, f"bucket size {bucket} outside [1, {MAX_COUNT}]")

    def _encode(self, x, ops, key, step, out):
        s, bucket = self._levels_bucket(x.size)
        stream = draw_stream(self._rng) if self._stochastic else 0
        buf, body = self._new_payload(x, out, {"levels": s, "bucket": bucket, "stream": stream}, ops)
        lo, hi = split_stream(stream)
        ops.quantize_levels(ops.float_work(x), bucket, s, self._use_max, self._stochastic, lo, hi,
                            level_bits(s), body["scales"], body["codes"])
        return buf

    def _decode(self, hdr, body, ops):
        s, bucket = hdr.params["levels"], hdr.params["bucket"]
        bits = level_bits(s)
        scales, codes = body["scales"], body["codes"]
        require(ops.count_bad_scales(scales) == 0,
                "bucket scales must be >= 0 and not infinite (NaN marks a non-finite bucket)")
        check_padding(ops.last_byte(codes), hdr.count * bits)
        out = ops.empty(hdr.count, _scale_dtype(hdr.dtype))
        bad = ops.dequantize_levels(codes, bits, s, bucket, scales, out)
        require(bad == 0, f"{bad} codes exceed the largest level code {2 * s}")
        return ops.astype(out, hdr.dtype)
