"""Native: the MPI library's own ``MPI_Allreduce``, the reference every benchmark compares against.

Which algorithm runs is the library's choice (MPICH 5: recursive doubling for short messages,
Rabenseifner otherwise; Open MPI's tuned component decides by size and communicator size). Inside a
public call it runs as ``MPI_Iallreduce`` under the call's guard, with recursive doubling as the
fallback once a failure has retired native on the communicator (``_runtime/guard.py``); it then
receives into a landing buffer of its own and copies the result out (one copy of the result more
than ``MPI_Allreduce``), so that an operation abandoned after a failure elsewhere can never write
into the caller's array.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._runtime import device as _device
from .._runtime.arrays import copy_into
from .._runtime.context import Context
from .._runtime.guard import native_call
from .._runtime.mpitypes import native_op, native_type
from ..ops import Op
from ..options import Options
from .._runtime.workspace import scratch
from . import recursive_doubling

__all__ = ["allreduce"]


@_device.staged(0, 1)
def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    dtype = native_type(buf.dtype)
    mpi_op = native_op(op, buf.dtype)
    if ctx.active is None:
        native_call(ctx, "Allreduce", (MPI.IN_PLACE if src is buf else [src, dtype],
                                       [buf, dtype], mpi_op), None)
        return
    # under a guard MPI receives into a landing buffer, never into buf (an operation abandoned after
    # a failure elsewhere may still write; ``_runtime/guard.py``), and only reads src, which the
    # fallback then still has, in place too
    land = scratch("native.landing", buf.size, buf)
    if native_call(ctx, "Allreduce", ([src, dtype], [land, dtype], mpi_op),
                   lambda: recursive_doubling.allreduce(src, buf, op, ctx, opts),
                   ("native.landing", land)):
        copy_into(land, buf)
