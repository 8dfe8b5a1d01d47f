"""The codec catalogue: one explicit name-to-class table.

>>> import compress
>>> codec = compress.get("topk", ratio=0.01)

A new codec is one module in ``compress/codecs/`` and one entry here (its import and its line in
:data:`CODECS`); ``compress.<Class>`` and ``compress.codecs.<Class>`` follow from the table.

A codec's parameters are its constructor's; :func:`parameters` lists them with their kinds (int,
float, bool, or anything) read from the annotations, :func:`get` rejects a name the codec does not
take in the user's words ("topk has no parameter 'k'; its parameters are: ratio"), and
:func:`parse_spec` types command-line values by those kinds (``qsgd:levels=7`` gives an int,
``randomk:unbiased_scaling=yes`` a bool, ``topk:ratio=abc`` a ValueError naming the parameter).
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable

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

__all__ = ["CODECS", "get", "parameters", "check_params", "parse_spec", "from_spec"]

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


def _codec(name: str) -> type[Codec]:
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; valid names: {', '.join(CODECS)}") from None


def parameters(name: str) -> dict[str, str]:
    """The parameters codec ``name`` takes -> their kind: ``"int"``, ``"float"``, ``"bool"`` or
    ``"any"`` (from the constructor's annotations; ``bool`` before ``float`` before ``int``)."""
    kinds = {}
    for pname, param in inspect.signature(_codec(name)).parameters.items():
        words = set(re.findall(r"\w+", str(param.annotation)))
        kinds[pname] = next((k for k in ("bool", "float", "int") if k in words), "any")
    return kinds


def check_params(name: str, names) -> None:
    """``ValueError`` in the user's words unless codec ``name`` takes every parameter in ``names``."""
    known = parameters(name)
    for key in names:
        if key not in known:
            takes = (f"its parameters are: {', '.join(known)}" if known
                     else "it takes no parameters")
            raise ValueError(f"{name} has no parameter {key!r}; {takes}")


def get(name: str, **params) -> Codec:
    """Instantiate the codec ``name`` with ``params``.

    Raises
    ------
    ValueError
        If ``name`` is not in :data:`CODECS` (the message lists the valid names), or the codec
        takes no parameter of one of the names given (the message lists those it takes).
    """
    check_params(name, params)
    return _codec(name)(**params)


_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _bool(text: str) -> bool:
    if text.lower() in _WORDS:
        return _WORDS[text.lower()]
    if text in ("0", "1"):
        return text == "1"
    raise ValueError


def _value(text: str) -> Any:
    """A value of unknown kind: bool (true/false), int or float when it reads as one, else text."""
    if text.lower() in ("true", "false"):
        return _WORDS[text.lower()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


#: parameter kind -> (parse the spec text, what it expects in words)
_PARSERS: dict[str, tuple[Callable[[str], Any], str]] = {
    "int": (int, "an integer"),
    "float": (float, "a number"),
    "bool": (_bool, "true or false"),
    "any": (_value, "a value"),
}


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name:k=v,k2=v2"`` (a command-line codec spec) -> ``(name, {k: v, k2: v2})``.

    Values are typed by the parameter's kind (:func:`parameters`); for a name that is no codec's,
    or a parameter the codec does not take, they are guessed (bool, int, float, else the text),
    and :func:`get` reports the name.

    Raises
    ------
    ValueError
        If a parameter is not of the form ``key=value``, or its value is not of its kind.
    """
    name, _, rest = spec.partition(":")
    name = name.strip()
    kinds = parameters(name) if name in CODECS else {}
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        k, eq, v = item.partition("=")
        k, v = k.strip(), v.strip()
        if not eq or not k:
            raise ValueError(f"codec parameter {item!r} in {spec!r} is not of the form key=value")
        parse, expected = _PARSERS[kinds.get(k, "any")]
        try:
            params[k] = parse(v)
        except ValueError:
            raise ValueError(f"{name} parameter {k!r} takes {expected}, got {v!r}") from None
    return name, params


def from_spec(spec: str, **overrides) -> Codec:
    """The codec a spec names, e.g. ``from_spec("qsgd:levels=7,bucket=256", seed=3)``."""
    name, params = parse_spec(spec)
    return get(name, **{**params, **overrides})
