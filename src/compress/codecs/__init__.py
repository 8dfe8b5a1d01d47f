"""One module per codec. The catalogue is :data:`compress.CODECS` (``compress/registry.py``); this
package re-exports its classes by name (``compress.codecs.TopK``), derived from that table, so a new
codec is its module plus one entry there."""

from __future__ import annotations


def __getattr__(name: str):
    from ..registry import CODECS

    for cls in CODECS.values():
        if cls.__name__ == name:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    from ..registry import CODECS

    return sorted(list(globals()) + [cls.__name__ for cls in CODECS.values()])
