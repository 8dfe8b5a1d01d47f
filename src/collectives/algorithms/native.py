"""Native: the MPI library's own ``MPI_Allreduce``, the reference every benchmark compares against.

Which algorithm runs is the library's choice (MPICH 5: recursive doubling for short messages,
Rabenseifner otherwise; Open MPI's tuned component decides by size and communicator size). Inside a
public call it runs as ``MPI_Iallreduce`` under the call's guard, with recursive doubling as the
fallback once a failure has retired native on the communicator (``_runtime/guard.py``); it then
receives into a landing buffer of its own and copies the result out (one copy of the result more
than ``MPI_Allreduce``), so that an operation abandoned after a failure elsewhere can never write
into the caller's array. A vector longer than :data:`LANDING_BYTES` (1 MiB) runs as one
``MPI_Iallreduce`` per piece of that size, each landing in the same small buffer and copied out
at once, while it is still in cache, instead of a second pass over memory after the whole
vector (docs/benchmarks/overhead.md). Every rank cuts the same pieces, and MPI reduces each
element within its piece in an order of MPI's choosing for that piece's size (as for any native
call, the same bits on every rank). Falling back reduces the rest of the vector by recursive
doubling, from the piece where native turned out retired (the first piece, on every rank:
docs/reliability.md). Outside a guard (``on_error="abort"``) the vector goes to
``MPI_Allreduce`` whole, as the caller's own call would. Either way the ranks first agree on the
count, dtype and op whenever they differ from the last ones agreed on (``_runtime/agree.py``): a
mismatch is a ``ValueError`` on every rank, never a truncated MPI collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .._runtime import device as _device
from .._runtime.agree import agree, key
from .._runtime.arrays import copy_into
from .._runtime.context import Context
from .._runtime.guard import native_call
from .._runtime.mpitypes import native_op, native_type
from ..ops import Op
from ..options import Options
from .._runtime.workspace import scratch
from . import recursive_doubling

__all__ = ["allreduce", "lane", "Lane", "LANDING_BYTES"]

#: Under a guard, a vector longer than this goes through MPI in pieces of this many bytes, each
#: landing in a buffer of this size and copied out while it is still in cache.
LANDING_BYTES = 1 << 20


@_device.staged(0, 1)
def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    _run(src, buf, op, ctx, opts, native_type(buf.dtype), native_op(op, buf.dtype),
         key("allreduce", buf.size, buf.dtype, op.name))


def _run(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options,
         dtype: MPI.Datatype, mpi_op: MPI.Op, sig: tuple) -> None:
    """:func:`allreduce` with the MPI datatype and operation of ``buf``'s dtype and ``op``, and
    the call's signature ``sig`` (``_runtime/agree.py``)."""
    if ctx.agreed is not sig:  # a signature not yet agreed on: the ranks check it together
        agree(ctx, sig)
    elif ctx.active is not None:  # repeated without a check: unless another rank checks it
        ctx.active.skip_check()
    if ctx.active is None:  # outside a guard: native_call's blocking call, made here
        ctx.comm.Allreduce(MPI.IN_PLACE if src is buf else [src, dtype], [buf, dtype], mpi_op)
        return
    # under a guard MPI receives into a landing buffer, never into buf (an operation abandoned after
    # a failure elsewhere may still write; ``_runtime/guard.py``), and only reads src, which the
    # fallback then still has, in place too; long vectors go in pieces through a landing buffer
    # of LANDING_BYTES (module docstring)
    n = buf.size
    step = max(1, LANDING_BYTES // buf.itemsize)
    if n <= step:  # one piece
        land = scratch("native.landing", n, buf)
        if native_call(ctx, "Allreduce", ([src, dtype], [land, dtype], mpi_op),
                       lambda: recursive_doubling.allreduce(src, buf, op, ctx, opts),
                       ("native.landing", land)):
            copy_into(land, buf)
        return
    land = scratch("native.landing", step, buf)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        piece = land[:hi - lo]
        if not native_call(ctx, "Allreduce", ([src[lo:hi], dtype], [piece, dtype], mpi_op),
                           lambda lo=lo: recursive_doubling.allreduce(src[lo:], buf[lo:], op,
                                                                      ctx, opts),
                           ("native.landing", land)):
            return  # the fallback reduced the rest (every rank falls back at the same piece)
        copy_into(piece, buf[lo:hi])


class Lane:
    """The repeats of one decided native allreduce on the same arrays (a remembered call, a
    plan's ``plan()``, a remembered ``iallreduce``), as an algorithm function ``(src, dst, op,
    ctx, opts)``: the MPI datatype and operation are resolved once, and the device check of
    :func:`allreduce` is skipped (NumPy arrays only). The callers pass arrays of the first
    call's dtype (their re-checks); the signature (``_runtime/agree.py``) is made once too, for
    the first call's count, and made again for any other count."""

    __slots__ = ("dtype", "mpi_op", "count", "sig")

    def __init__(self, buf: np.ndarray, op: Op) -> None:
        self.dtype, self.mpi_op = native_type(buf.dtype), native_op(op, buf.dtype)
        self.count, self.sig = buf.size, key("allreduce", buf.size, buf.dtype, op.name)

    def __call__(self, src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context,
                 opts: Options) -> None:
        sig = self.sig if buf.size == self.count else key("allreduce", buf.size, buf.dtype,
                                                          op.name)
        _run(src, buf, op, ctx, opts, self.dtype, self.mpi_op, sig)


def lane(fn: Any, src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context,
         opts: Options) -> Any:
    """:func:`allreduce` (``fn``) for the repeats of a call on the same arrays: a :class:`Lane`
    for NumPy arrays, else ``fn`` itself."""
    if type(buf) is not np.ndarray or type(src) is not np.ndarray:
        return fn
    return Lane(buf, op)
