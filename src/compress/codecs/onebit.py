"""1-bit SGD: one bit per element, two reconstruction values.

How it works: bit ``i`` is set when ``x[i] < 0`` (by value: ``-0.0`` and ``+0.0`` are the same number
and both count as non-negative, as does NaN; see :mod:`compress.codecs._signs`); the header carries
the mean of the non-negative entries and the mean of the negative entries, which are the values that
minimise the squared reconstruction error for that bit pattern; decoding maps each bit to its mean.
Seide, Fu, Droppo, Li & Yu, "1-Bit Stochastic Gradient Descent and its Application to Data-Parallel
Distributed Training of Speech DNNs", Interspeech 2014 (they quantize per matrix column; this codec
uses one pair per tensor).

Non-finite input: a ``+inf`` makes the non-negative mean ``inf`` and a ``-inf`` the negative mean
``-inf``, so the entries of that side decode to it; a NaN makes both means NaN, so every entry
decodes to NaN.

Wire size: ``header + ceil(n / 8)`` bytes, ``header = 16 + 8 * ndim + 16`` (two float64 means).

Properties: not summable, biased, needs error feedback (the paper's "error feedback" is exactly
:class:`compress.ErrorFeedback`), aggregation "mean".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._util import require
from ._signs import SignCodec

__all__ = ["OneBit"]


@dataclass(eq=False)
class OneBit(SignCodec):
    """One bit per element with the means of the non-negative and the negative entries."""

    name = "onebit"
    codec_id = 12
    needs_error_feedback = True
    PARAMS = (("pos", "d"), ("neg", "d"))

    def _values(self, params):
        return params["pos"], params["neg"]

    def _check_params(self, hdr):
        pos, neg = hdr.params["pos"], hdr.params["neg"]
        require(pos >= 0 or math.isnan(pos), f"mean of the non-negative entries {pos} is negative")
        require(neg <= 0 or math.isnan(neg), f"mean of the negative entries {neg} is positive")

    def _encode(self, x, ops, key, step, out):
        n = x.size

        def means(pos, neg, negatives):
            positives = n - negatives
            return {"pos": pos / positives if positives else 0.0,
                    "neg": neg / negatives if negatives else 0.0}

        return self._emit_scaled(x, ops, out, means)
