"""MPI datatypes and operations for the "native" calls into the MPI library.

The hand-written algorithms send raw bytes and reduce in NumPy, so only the native calls need MPI
to understand the element type. float16 is not an MPI type: MPICH offers ``MPIX_C_FLOAT16`` (mpi4py
typecode ``"e"``); where the library lacks it (Open MPI), a user-defined operation over 16-bit words
reduces the values in NumPy instead. bfloat16 travels as 16-bit words (``MPI.UINT16_T``) reduced by
a user-defined operation running the op's word form (``ops.Op.words``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from mpi4py import MPI

from ..ops import Op

__all__ = ["native_type", "native_op"]


@lru_cache(maxsize=None)
def _mpi_float16() -> MPI.Datatype | None:
    try:
        dt = MPI.Datatype.fromcode("e")
    except (KeyError, ValueError, MPI.Exception):
        return None
    return None if dt == MPI.DATATYPE_NULL else dt


@lru_cache(maxsize=None)
def _user_op(ufunc: np.ufunc, dtype: np.dtype) -> MPI.Op:
    def reduce(inbuf, inoutbuf, datatype):  # MPI: inout = in (op) inout
        a = np.frombuffer(inbuf, dtype=dtype)
        b = np.frombuffer(inoutbuf, dtype=dtype)
        ufunc(a, b, out=b)

    return MPI.Op.Create(reduce, commute=True)


def _uses_user_op(dtype: np.dtype, force_user_op: bool) -> bool:
    return dtype.char == "e" and (force_user_op or _mpi_float16() is None)


_TYPES: dict[np.dtype, MPI.Datatype] = {}


def native_type(dtype: np.dtype, force_user_op: bool = False) -> MPI.Datatype:
    """The MPI datatype for ``dtype`` in a native reduction."""
    if not force_user_op:  # the per-call path: remembered by dtype
        found = _TYPES.get(dtype)
        if found is None:
            found = _TYPES[dtype] = _lookup(dtype)
        return found
    return _lookup(dtype, force_user_op)


def _lookup(dtype: np.dtype, force_user_op: bool = False) -> MPI.Datatype:
    if _uses_user_op(dtype, force_user_op):
        return MPI.UINT16_T
    if dtype == np.float16:
        return _mpi_float16()
    return MPI.Datatype.fromcode(dtype.char)


def native_op(op: Op, dtype: np.dtype, force_user_op: bool = False) -> MPI.Op:
    """The MPI operation for ``op`` on ``dtype`` (a user-defined op for float16 where needed, and
    for bfloat16 words always: no MPI library reduces bfloat16)."""
    if op.words or _uses_user_op(dtype, force_user_op):
        return _user_op(op.ufunc, dtype)
    return op.mpi
