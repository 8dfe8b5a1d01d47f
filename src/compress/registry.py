"""The codec catalogue: one explicit name-to-class table.

>>> import compress
>>> codec = compress.get("topk", ratio=0.01)
"""

from __future__ import annotations

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

__all__ = ["CODECS", "get"]

CODECS: dict[str, type[Codec]] = {
    "none": Identity,
    "fp16": FP16,
    "bf16": BF16,
    "topk": TopK,
    "randomk": RandomK,
    "threshold": Threshold,
    "dgc": DGC,
    "qsgd": QSGD,
    "terngrad": TernGrad,
    "signsgd": SignSGD,
    "efsignsgd": EFSignSGD,
    "onebit": OneBit,
    "eightbit": EightBit,
    "natural": Natural,
    "powersgd": PowerSGD,
}


def get(name: str, **params) -> Codec:
    """Instantiate the codec ``name`` with ``params``.

    Raises
    ------
    ValueError
        If ``name`` is not in :data:`CODECS` (the message lists the valid names).
    """
    try:
        cls = CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; valid names: {', '.join(CODECS)}") from None
    return cls(**params)
