"""Stopwatches for the report: compute, encode/decode, communication.

:class:`Clock` accumulates seconds per category. :func:`time_methods` replaces methods of a codec
object (an instance attribute shadows the class's method) with versions that add their time to a
category; nested timed calls (ErrorFeedback.encode calling the codec's encode) count once, at
the outermost. Communication time is then the exchange's wall time minus the codec time inside it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from functools import wraps
from typing import Any, Iterable

from ..diagnostics.timeline import hooks as _timeline

__all__ = ["Clock", "time_methods", "CODEC_METHODS", "CODEC_PARTS"]

#: methods of codecs and memories that do encode/decode work inside a compressed allreduce, and
#: which of the two each is (the report splits the codec's time so): encoding makes this rank's
#: payload (error feedback's compensation included); decoding reads payloads back (and error
#: feedback's new residual)
CODEC_PARTS = {"encode": "encode", "compensate": "encode", "summable_encode": "encode",
               "compute_p": "encode", "compute_q": "encode", "orthogonalize": "encode",
               "decode": "decode", "remember": "decode", "summable_decode": "decode",
               "sparse_parts": "decode", "reconstruct": "decode"}
CODEC_METHODS = tuple(CODEC_PARTS)


class Clock:
    """Seconds per category, with a reentrancy guard per category."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._depth: dict[str, int] = defaultdict(int)

    @contextmanager
    def measure(self, category: str, part: str | None = None):
        """Add the time of the block to ``category`` (and to ``part`` too, a subdivision of it:
        "encode" of "codec"), unless a block of ``category`` is already open: nested blocks count
        once, in the outermost one's part."""
        self._depth[category] += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._depth[category] -= 1
            if not self._depth[category]:
                t1 = time.perf_counter()
                self.seconds[category] += t1 - t0
                if part is not None:
                    self.seconds[part] += t1 - t0
                if _timeline.ACTIVE is not None:  # --timeline: the phase as a span
                    _timeline.ACTIVE.add("codec" if category == "codec" else "user", category,
                                         t0, t1)


def time_methods(obj: Any, clock: Clock, category: str,
                 names: Iterable[str] = CODEC_METHODS,
                 parts: dict[str, str] | None = None) -> None:
    """Make ``obj``'s methods in ``names`` (those it has) add their time to ``category``, and
    each to its part in ``parts`` (method name -> part; ``CODEC_PARTS`` for the codec methods)
    where it has one."""
    parts = CODEC_PARTS if parts is None else parts
    for name in names:
        fn = getattr(obj, name, None)
        if callable(fn):
            setattr(obj, name, _timed(fn, clock, category, parts.get(name)))


def _timed(fn, clock: Clock, category: str, part: str | None):
    @wraps(fn)
    def timed(*args, **kwargs):
        with clock.measure(category, part):
            return fn(*args, **kwargs)
    return timed
