"""What a remembered call re-checks before it repeats: the one "nothing changed" test.

A training loop calls the same collective on the same arrays every step. The blocking
``allreduce`` (``api._Repeats``) and ``iallreduce`` (``engine.nonblocking``) remember a call's
checks and decision, keyed by the identity of its arrays, and repeat it after :func:`unchanged`
says that nothing that could change in place has (``allreduce`` makes the same test in line, on
its fast path).
"""

from __future__ import annotations

from typing import Any

__all__ = ["unchanged"]


def unchanged(e: Any, x: Any, out: Any, opts: Any) -> bool:
    """Whether a remembered call's checks still hold for ``x`` and ``out`` (the same objects)
    under ``opts``: what can change in place has not (shapes, strides, dtypes, ``out``'s write
    flag, the options in force); the caller checks that its communicator is still usable.
    ``e``: a remembered call with the attributes ``shape``, ``xstrides``, ``ostrides``, ``dtype``
    and ``opts``."""
    return (opts is e.opts and x.shape == e.shape and out.shape == e.shape
            and x.dtype is e.dtype and out.dtype is e.dtype and x.strides == e.xstrides
            and out.strides == e.ostrides and out.flags.writeable)
