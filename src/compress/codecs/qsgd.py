"""QSGD: stochastic quantization to s levels per sign, bucketed L2 norms.

How it works: the input is cut into buckets of ``bucket`` elements with norm ``||v||_2``; each element
``x`` becomes ``sign(x) * l / s * ||v||_2`` where ``l`` is ``|x| / ||v||_2 * s`` rounded up with
probability equal to its fractional part, so ``E[decode(encode(x))] = x``. Codes ``l * sign + s`` are
bit-packed with ``bits = bit_length(2 s)`` bits (``levels=127`` gives exactly 8 bits). Rounding uses a
counter-based hash of (per-encode stream, element index), so encodes are reproducible from ``seed``.
Alistarh, Grubic, Li, Tomioka & Vojnovic, "QSGD: Communication-Efficient SGD via Gradient Quantization
and Encoding", NeurIPS 2017 (without their Elias coding of levels).

Wire size: ``header + ceil(n / bucket) * S + ceil(n * bits / 8)`` bytes, ``S = 8`` for float64 input
and 4 otherwise, ``header = 16 + 8 * ndim + 24`` (levels, bucket, stream).

Properties: not summable (scales differ: allgather, or all-to-all and requantize), unbiased, no error
feedback needed, aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass

from .._util import require
from ._levels import MAX_LEVELS, LevelCodec
from ._private import PrivateRandom

__all__ = ["QSGD"]


@dataclass(eq=False)
class QSGD(PrivateRandom, LevelCodec):
    """QSGD with ``levels`` levels per sign and L2-norm buckets.

    Parameters
    ----------
    levels : int
        ``s``, in [1, 32767]; 127 gives 8 bits per element.
    bucket : int
        Elements per norm bucket.
    seed : None, int or numpy.random.Generator
        Source of the per-encode random streams.
    """

    levels: int = 127
    bucket: int = 512
    seed: object = None

    name = "qsgd"
    codec_id = 8
    unbiased = True

    def _check(self):
        require(1 <= self.levels <= MAX_LEVELS, f"levels must be in [1, {MAX_LEVELS}], got {self.levels}")
        require(self.bucket >= 1, f"bucket must be >= 1, got {self.bucket}")

    def _levels_bucket(self, n):
        return self.levels, self.bucket
