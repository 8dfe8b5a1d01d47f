"""EF-signSGD: scaled sign with error feedback.

How it works: the payload carries the sign bits and one scale, the mean magnitude
``||x||_1 / n``; decoding gives ``±scale``. Used with :class:`compress.ErrorFeedback`, which adds the
residual ``x - decode(encode(x))`` to the next gradient; that fixes the convergence problems of plain
signSGD. Karimireddy, Rebjock, Stich & Jaggi, "Error Feedback Fixes SignSGD and other Gradient
Compression Schemes", ICML 2019.

Wire size: ``header + ceil(n / 8)`` bytes, ``header = 16 + 8 * ndim + 8`` (the scale, float64).

Properties: not summable (scales differ across ranks), biased, needs error feedback, aggregation
"mean".
"""

from __future__ import annotations

from dataclasses import dataclass

from ._signs import SignCodec

__all__ = ["EFSignSGD"]


@dataclass(eq=False)
class EFSignSGD(SignCodec):
    """Sign times the mean magnitude."""

    name = "efsignsgd"
    codec_id = 11
    needs_error_feedback = True
    PARAMS = (("scale", "d"),)

    def _values(self, params):
        return params["scale"], -params["scale"]

    def _encode(self, x, ops, key, step, out):
        return self._emit_scaled(x, ops, out, self._scale_of(x.size))

    @staticmethod
    def _scale_of(n):
        return lambda pos, neg, _: {"scale": (pos - neg) / n if n else 0.0}
