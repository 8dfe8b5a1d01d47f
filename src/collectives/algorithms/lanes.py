"""Lanes: an allreduce algorithm made once for the repeats of one call on the same arrays.

A training loop calls the same allreduce on the same arrays at every step: a remembered
``allreduce(x, out=y)`` (``_runtime/repeats.py``), a plan's ``plan()``, a remembered ``iallreduce``.
Their first run decides the algorithm; what that algorithm would look up again at every call
(shm's team, op code and compiled kernel entry; native's MPI datatype and operation) can then
be resolved once, into a *lane*: an object called like the algorithm function, ``(src, dst,
op, ctx, opts)``. Each algorithm that has one says how it is made in :data:`LANES`; any other
algorithm runs as it is. :func:`lane` gives the whole run of a repeat (for "avg" the division
too), so a repeat calls it with no frame between the guard and the algorithm. Callers keep the
lanes' promise: every repeat passes arrays of the first call's dtype and memory layout (their
re-checks), on the context the lane was made on while it lives.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..ops import Op
from ..options import Options
from . import native, shm
from .._runtime.context import Context

__all__ = ["lane", "LANES"]

#: the algorithm functions that have a lane, and each one's maker ``(fn, src, dst, op, ctx,
#: opts) -> lane or fn``
LANES: dict[Any, Callable[..., Any]] = {
    shm.allreduce: shm.lane,
    shm.allreduce_without_waiting: shm.lane,
    native.allreduce: native.lane,
}


def lane(fn: Any, src: np.ndarray, dst: np.ndarray, op: Op, ctx: Context, opts: Options) -> Any:
    """The run of a repeat of a call on ``src`` and ``dst`` whose algorithm function ``fn`` was
    decided on ``ctx``, called as ``fn``: its lane where it has one and the call can take it,
    else ``fn`` itself; for "avg" followed by the division."""
    make = LANES.get(fn)
    made = fn if make is None else make(fn, src, dst, op, ctx, opts)
    return _Averaged(made) if op.average else made


class _Averaged:
    """An algorithm function (the sum of "avg") followed by the division by the ranks."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, src: np.ndarray, dst: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
        self.fn(src, dst, op, ctx, opts)
        op.divide(dst, ctx.comm.size)  # repeats have two ranks or more (trivial ones aside)
