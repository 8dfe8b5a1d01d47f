"""Native: the MPI library's own ``MPI_Allreduce``, the reference every benchmark compares against.

Which algorithm runs is the library's choice (MPICH 5: recursive doubling for short messages,
Rabenseifner otherwise; Open MPI's tuned component decides by size and communicator size). Inside a public call it runs
as ``MPI_Iallreduce`` under the call's guard, with recursive doubling as the fallback once a
failure has retired native on the communicator (``_guard.py``).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import _device
from .._arrays import copy_into
from .._context import Context
from .._guard import active, native_call
from .._mpitypes import native_op, native_type
from ..ops import Op
from ..options import Options
from .._workspace import scratch
from . import recursive_doubling

__all__ = ["allreduce"]


@_device.staged(0, 1)
def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    dtype = native_type(buf.dtype)
    if src is buf and active() is not None:
        # in place under a guard: the input is kept, for the fallback (``_guard.py``) that
        # runs if the native operation can never finish (MPI may have written buf already)
        src = scratch("native.input", buf.size, buf)
        copy_into(buf, src)
    sendbuf = MPI.IN_PLACE if src is buf else [src, dtype]
    native_call(ctx, "Allreduce", (sendbuf, [buf, dtype], native_op(op, buf.dtype)),
                lambda: recursive_doubling.allreduce(src, buf, op, ctx, opts))
