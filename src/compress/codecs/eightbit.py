"""8-bit linear quantization with a per-bucket max-magnitude scale.

How it works: each bucket of ``bucket`` elements stores ``scale = max |x|``; each element becomes the
nearest of the 255 levels ``q * scale / 127``, ``q`` in [-127, 127], stored as the byte ``q + 127``.
Deterministic round-to-nearest, so biased (error at most half a step). This is the *linear* 8-bit
format; Dettmers, "8-Bit Approximations for Parallelism in Deep Learning", ICLR 2016, proposes a
dynamic (tree) 8-bit data type and compares it with this linear baseline — we implement the linear one.

Wire size: ``header + ceil(n / bucket) * S + n`` bytes, ``S = 8`` for float64 input and 4 otherwise,
``header = 16 + 8 * ndim + 24``.

Properties: not summable (scales differ), biased (but no error feedback needed in practice: the error
is tiny), aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass

from .._util import require
from ._levels import LevelCodec

__all__ = ["EightBit"]


@dataclass(eq=False)
class EightBit(LevelCodec):
    """Linear int8 with max-magnitude bucket scales.

    Parameters
    ----------
    bucket : int
        Elements per scale.
    """

    bucket: int = 2048

    name = "eightbit"
    codec_id = 13
    _use_max = True
    _stochastic = False

    def __post_init__(self):
        require(self.bucket >= 1, f"bucket must be >= 1, got {self.bucket}")

    def _levels_bucket(self, n):
        return 127, self.bucket
