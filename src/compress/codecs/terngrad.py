"""TernGrad: stochastic ternary levels {-1, 0, 1} times a max-magnitude scale.

How it works: with ``s_t = max |x|`` over the tensor (or over each bucket when ``bucket`` is set),
each element becomes ``s_t * sign(x) * b`` with ``b ~ Bernoulli(|x| / s_t)``, which is unbiased. This
is the level quantizer of :mod:`compress.codecs._levels` with one level per sign, max scaling and
2-bit codes. Wen et al., "TernGrad: Ternary Gradients to Reduce Communication in Distributed Deep
Learning", NeurIPS 2017 (their optional gradient clipping is not applied here; it would bias the
estimate).

Wire size: ``header + ceil(n / bucket) * S + ceil(n / 4)`` bytes (``bucket = n`` by default, so one
scale), ``S = 8`` for float64 input and 4 otherwise, ``header = 16 + 8 * ndim + 24``.

Properties: not summable, unbiased, no error feedback needed, aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass

from .._util import require
from ._levels import LevelCodec
from ._private import PrivateRandom

__all__ = ["TernGrad"]


@dataclass(eq=False)
class TernGrad(PrivateRandom, LevelCodec):
    """Ternary stochastic quantization.

    Parameters
    ----------
    bucket : int or None
        Elements per scale; None uses one scale for the whole tensor (the paper's per-layer scale).
    seed : None, int or numpy.random.Generator
        Source of the per-encode random streams.
    """

    bucket: int | None = None
    seed: object = None

    name = "terngrad"
    codec_id = 9
    unbiased = True
    _use_max = True

    def _check(self):
        require(self.bucket is None or self.bucket >= 1, f"bucket must be None or >= 1, got {self.bucket}")

    def _levels_bucket(self, n):
        return 1, (self.bucket or max(n, 1))
