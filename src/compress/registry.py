"""The codec catalogue: one explicit name-to-class table.

>>> import compress
>>> codec = compress.get("topk", ratio=0.01)

A new codec is one module in ``compress/codecs/`` and one entry here (its import and its line in
:data:`CODECS`); ``compress.<Class>`` and ``compress.codecs.<Class>`` follow from the table.
"""

from __future__ import annotations

from typing import Any

from .base import Codec
from .codecs.bf16 import BF16
from .codecs.dgc import DGC
from .codecs.efsignsgd import EFSignSGD
from .codecs.eightbit import EightBit
from .codecs.fp16 import FP16
from .codecs.natural import Natural
from .codecs.none import Identity
from .codecs.onebit import OneBit
from .codecs.powersgd import PowerSGD
from .codecs.qsgd import QSGD
from .codecs.randomk import RandomK
from .codecs.signsgd import SignSGD
from .codecs.terngrad import TernGrad
from .codecs.threshold import Threshold
from .codecs.topk import TopK

__all__ = ["CODECS", "get", "parse_spec", "from_spec"]

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


_WORDS = {"true": True, "false": False}


def _value(text: str) -> Any:
    """A spec value as bool (true/false), int or float when it reads as one, else the string."""
    if text.lower() in _WORDS:
        return _WORDS[text.lower()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name:k=v,k2=v2"`` (a command-line codec spec) -> ``(name, {k: v, k2: v2})``.

    Raises
    ------
    ValueError
        If a parameter is not of the form ``key=value``.
    """
    name, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise ValueError(f"codec parameter {item!r} in {spec!r} is not of the form key=value")
        params[k.strip()] = _value(v.strip())
    return name.strip(), params


def from_spec(spec: str, **overrides) -> Codec:
    """The codec a spec names, e.g. ``from_spec("qsgd:levels=7,bucket=256", seed=3)``."""
    name, params = parse_spec(spec)
    return get(name, **{**params, **overrides})
