"""signSGD: send one sign bit per element.

How it works: bit ``i`` is set when ``x[i] < 0`` (by value: ``-0.0``, ``+0.0`` and NaN are not
negative; see :mod:`compress.codecs._signs`); decoding gives ``+scale`` or ``-scale`` with ``scale
= 1``. Workers' signs are combined by majority vote (sign of the sum). Bernstein et al., "signSGD:
Compressed Optimisation for Non-Convex Problems", ICML 2018, and "signSGD with Majority Vote is
Communication Efficient and Fault Tolerant", ICLR 2019.

Non-finite input: a sign says nothing about overflow, and the sign of an infinite sum is finite, so
a payload of an input holding ``±inf`` or NaN has ``scale = NaN`` and decodes to NaN everywhere; a
majority vote over it is NaN too (an overflowed gradient reaches the loss scaler).

Wire size: ``header + ceil(n / 8)`` bytes, ``header = 16 + 8 * ndim + 8`` (the scale, 1 or NaN).

Properties: not summable as bits (a sum of ±1 values needs log2(p) bits: allgather the bits, or
allreduce the decoded ±1 in a small integer type), biased, no error feedback (majority vote),
aggregation "majority".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._util import require
from ._signs import SignCodec

__all__ = ["SignSGD"]


@dataclass(eq=False)
class SignSGD(SignCodec):
    """Sign of each element, ±1 on decode (NaN for non-finite input)."""

    name = "signsgd"
    codec_id = 10
    aggregation = "majority"
    PARAMS = (("scale", "d"),)

    def _values(self, params):
        return params["scale"], -params["scale"]

    def _check_params(self, hdr):
        scale = hdr.params["scale"]
        require(scale == 1.0 or math.isnan(scale), f"signsgd scale {scale} is neither 1 nor NaN")

    def _encode(self, x, ops, key, step, out):
        buf, _, nonfinite = self._emit(x, ops, out)
        self._write_params(buf, x, {"scale": math.nan if nonfinite else 1.0}, ops)
        return buf
