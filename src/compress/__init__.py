"""Gradient-compression codecs for data-parallel training (no MPI dependency).

>>> import compress
>>> codec = compress.get("topk", ratio=0.01)
>>> payload = codec.encode(x)        # one contiguous np.uint8 array
>>> y = codec.decode(payload)        # dense, x's shape and dtype

See ``docs/compression.md`` for the wire formats, properties and papers of every codec.
"""

from .base import Codec
from .codecs import (
    BF16,
    DGC,
    FP16,
    QSGD,
    EFSignSGD,
    EightBit,
    Identity,
    Natural,
    OneBit,
    PowerSGD,
    RandomK,
    SignSGD,
    TernGrad,
    Threshold,
    TopK,
)
from .memory import DGCMemory, ErrorFeedback
from .registry import CODECS, from_spec, get, parse_spec

__all__ = [
    "CODECS",
    "get",
    "parse_spec",
    "from_spec",
    "Codec",
    "ErrorFeedback",
    "DGCMemory",
    "BF16",
    "DGC",
    "EFSignSGD",
    "EightBit",
    "FP16",
    "Identity",
    "Natural",
    "OneBit",
    "PowerSGD",
    "QSGD",
    "RandomK",
    "SignSGD",
    "TernGrad",
    "Threshold",
    "TopK",
]
