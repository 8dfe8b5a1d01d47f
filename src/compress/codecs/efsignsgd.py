"""EF-signSGD: scaled sign with error feedback.

How it works: the payload carries one bit per element, set when ``x[i] < 0`` (by value: ``-0.0`` and
NaN are not negative; see :mod:`compress.codecs._signs`), and one scale, the mean magnitude
``||x||_1 / n``; decoding gives ``±scale``. Used with :class:`compress.ErrorFeedback`, which adds the
residual ``x - decode(encode(x))`` to the next gradient; that fixes the convergence problems of plain
signSGD. Karimireddy, Rebjock, Stich & Jaggi, "Error Feedback Fixes SignSGD and other Gradient
Compression Schemes", ICML 2019.

Non-finite input: the scale of an input holding ``±inf`` is ``inf`` and of one holding NaN is NaN,
so every element decodes to ``±inf`` or NaN.

Wire size: ``header + ceil(n / 8)`` bytes, ``header = 16 + 8 * ndim + 8`` (the scale, float64).

Properties: not summable (scales differ across ranks), biased, needs error feedback, aggregation
"mean".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._util import require
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

    def _check_params(self, hdr):
        scale = hdr.params["scale"]
        require(scale >= 0 or math.isnan(scale), f"scale {scale} is negative")

    def _encode(self, x, ops, key, step, out):
        n = x.size
        return self._emit_scaled(x, ops, out, lambda pos, neg, count:
                                 {"scale": (pos - neg) / n if n else 0.0})
