"""Native: the MPI library's own ``MPI_Allreduce``, the reference every benchmark compares against.

Which algorithm runs is the library's choice (MPICH 5: recursive doubling for short messages,
Rabenseifner otherwise; Open MPI's tuned component decides by size and communicator size).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import _device
from .._context import Context
from .._mpitypes import native_op, native_type
from ..ops import Op
from ..options import Options

__all__ = ["allreduce"]


@_device.staged(0, 1)
def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    dtype = native_type(buf.dtype)
    sendbuf = MPI.IN_PLACE if src is buf else [src, dtype]
    ctx.comm.Allreduce(sendbuf, [buf, dtype], native_op(op, buf.dtype))
