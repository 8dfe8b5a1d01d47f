"""1-bit SGD: one bit per element, two reconstruction values.

How it works: bit ``i`` is the sign bit of ``x[i]``; the header carries the mean of the non-negative
entries and the mean of the negative entries, which are the values that minimise the squared
reconstruction error for that bit pattern; decoding maps each bit to its mean. Seide, Fu, Droppo, Li &
Yu, "1-Bit Stochastic Gradient Descent and its Application to Data-Parallel Distributed Training of
Speech DNNs", Interspeech 2014 (they quantize per matrix column; this codec uses one pair per tensor).

Wire size: ``header + ceil(n / 8)`` bytes, ``header = 16 + 8 * ndim + 16`` (two float64 means).

Properties: not summable, biased, needs error feedback (the paper's "error feedback" is exactly
:class:`compress.ErrorFeedback`), aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass

from ._signs import SignCodec

__all__ = ["OneBit"]


@dataclass(eq=False)
class OneBit(SignCodec):
    """Sign bit with the means of the positive and negative parts."""

    name = "onebit"
    codec_id = 12
    needs_error_feedback = True
    PARAMS = (("pos", "d"), ("neg", "d"))

    def _values(self, params):
        return params["pos"], params["neg"]

    def _encode(self, x, ops, key, step, out):
        return self._emit_scaled(x, ops, out, self._means_of(x.size))

    @staticmethod
    def _means_of(n):
        def means(pos, neg, negatives):
            positives = n - negatives
            return {"pos": pos / positives if positives else 0.0,
                    "neg": neg / negatives if negatives else 0.0}

        return means
