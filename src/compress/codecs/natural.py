"""Natural compression: unbiased stochastic rounding to a power of two.

How it works: with ``|x| = 2**e * (1 + m)``, ``0 <= m < 1``, the magnitude becomes ``2**(e+1)`` with
probability ``m`` and ``2**e`` otherwise, so ``E = |x|``; the sign is kept. On float32 bits this is:
keep the 8-bit exponent field, add one with probability ``mantissa / 2**23``. The same rule is unbiased
for subnormals (they round to 0 or to 2**-126). Only the sign (1 bit) and exponent (8 bits) travel.
float16 and float64 input are converted to float32 first (float64 values outside the float32 range
become 0 or infinity). Exponent 255 (infinity/NaN, or rounding up from the largest binade) decodes to
infinity. Horvath, Ho, Horvath, Sahu, Canini & Richtarik, "Natural Compression for Distributed Deep
Learning", 2019 (variance factor 9/8).

Wire size: ``header + n + ceil(n / 8)`` bytes (exponent bytes, then sign bits),
``header = 16 + 8 * ndim + 8`` (the random stream).

Properties: not summable, unbiased, no error feedback needed, aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._layout import Section
from .._seeding import draw_stream, split_stream
from .._util import check_padding
from ..base import Codec
from ._private import PrivateRandom

__all__ = ["Natural"]


@dataclass(eq=False)
class Natural(PrivateRandom, Codec):
    """Natural compression (sign + exponent, 9 bits per element).

    Parameters
    ----------
    seed : None, int or numpy.random.Generator
        Source of the per-encode random streams.
    """

    seed: object = None

    name = "natural"
    codec_id = 14
    unbiased = True
    PARAMS = (("stream", "Q"),)

    def body_nbytes(self, n, dtype):
        return n + (n + 7) // 8

    def _sections(self, n, dtype, params):
        return [Section("exponents", np.uint8, n), Section("signs", np.uint8, (n + 7) // 8)]

    def _encode(self, x, ops, key, step, out):
        stream = draw_stream(self._rng)
        buf, body = self._new_payload(x, out, {"stream": stream}, ops)
        u = ops.astype(x.reshape(-1), np.float32).view(np.uint32)
        ops.natural_encode(u, *split_stream(stream), body["exponents"])
        ops.pack_sign_bits(u, 31, body["signs"])
        return buf

    def _decode(self, hdr, body, ops):
        check_padding(ops.last_byte(body["signs"]), hdr.count)
        out = ops.empty(hdr.count, np.uint32)
        ops.natural_decode(body["exponents"], body["signs"], out)
        return ops.astype(out.view(np.float32), hdr.dtype)
