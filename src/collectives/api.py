"""The public collectives: check arguments, handle trivial cases, dispatch by name.

Conventions shared by every function here (those of ``MPI_Allreduce`` and mpi4py):

- ``x`` is a contiguous NumPy array of a dtype in :data:`SUPPORTED_DTYPES`; results keep its
  dtype. ``out=None`` returns a new array; ``out=x`` works in place where the shapes allow.
- ``comm=None`` means ``MPI.COMM_WORLD``; any intracommunicator works. Messages travel on a
  private duplicate of ``comm``, so they never mix with the caller's.
- ``op`` is "sum", "prod", "min", "max" or "avg" (floats only), or ``MPI.SUM``-style objects.
- Bad arguments raise ``TypeError``/``ValueError`` before any message is sent. ``validate=True``
  (default: ``COLLECTIVES_VALIDATE``) also cross-checks the arguments no rank can see alone.
- Every rank ends with bitwise identical results.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from mpi4py import MPI

from ._arrays import check_input, check_out, copy_into, flat, new_like, writeable
from ._context import context
from ._p2p import partition
from ._validate import checked, pick as _pick, setup as _setup
from .algorithms import ALGORITHMS, FLAT
from .blocks import ALLGATHER, BCAST, REDUCE, REDUCE_SCATTER
from .ops import Op, get_op
from .options import Options

__all__ = ["allreduce", "reduce_scatter", "allgather", "bcast", "reduce"]

OpLike = str | MPI.Op | Op


def _check_root(root: object, comm: MPI.Comm) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= root < comm.size:
        raise ValueError(f"root must be a rank in 0..{comm.size - 1}, got {root!r}")
    return int(root)


def _offsets(counts: Sequence[int] | None, total: int, p: int) -> list[int]:
    """Element offsets of the p blocks: ``counts`` if given (checked), else a near-equal split."""
    if counts is None:
        return partition(total, p)
    sizes = np.asarray(counts)
    if sizes.shape != (p,) or sizes.dtype.kind not in "iu" or (sizes < 0).any():
        raise ValueError(f"counts must be {p} non-negative integers (one per rank), got {counts!r}")
    if int(sizes.sum()) != total:
        raise ValueError(f"counts sum to {int(sizes.sum())}, expected {total}")
    return [0] + np.cumsum(sizes).tolist()


def _finish_avg(op: Op, result: np.ndarray, p: int) -> None:
    if op.average and p > 1:
        np.divide(result, p, out=result)


def allreduce(x: np.ndarray, *, out: np.ndarray | None = None, op: OpLike = "sum",
              algorithm: str = "auto", comm: MPI.Comm | None = None,
              validate: bool | None = None, options: Options | None = None) -> np.ndarray:
    """Reduce ``x`` elementwise over all ranks of ``comm``; every rank gets the result.

    Parameters
    ----------
    x
        Contiguous array; the same shape and dtype on every rank.
    out
        Result array (``x``'s shape and dtype); ``out=x`` reduces in place. None: a new array.
    op
        "sum", "prod", "min", "max", "avg", or ``MPI.SUM``/``MPI.PROD``/``MPI.MIN``/``MPI.MAX``.
    algorithm
        A name in :data:`collectives.ALGORITHMS`.
    comm
        Intracommunicator (default ``MPI.COMM_WORLD``).
    validate
        Cross-check arguments across ranks first (default: ``Options.validate``).
    options
        Segment size, emulated node size, inter-node algorithm (default: from the environment).

    Returns
    -------
    numpy.ndarray
        ``out``, holding the reduction; bitwise identical on every rank.
    """
    comm, opts, validate = _setup(comm, options, validate)

    def check():
        a = check_input(x)
        the_op = get_op(op, a.dtype)
        fn = _pick(ALGORITHMS, algorithm, "algorithm")
        _pick(FLAT, opts.inter_algorithm, "inter_algorithm")
        res = new_like(a) if out is None else check_out(out, a)
        sig = {"count": a.size, "dtype": a.dtype, "op": the_op.name, "algorithm": algorithm}
        return (a, the_op, fn, res), sig

    a, the_op, fn, res = checked("allreduce", comm, validate, check)
    src = flat(a)
    dst = src if res is a else flat(res)
    if a.size == 0 or comm.size == 1:  # trivial cases, here only
        copy_into(src, dst)
        return res
    fn(src, dst, the_op, context(comm), opts)
    _finish_avg(the_op, dst, comm.size)
    return res


def reduce_scatter(x: np.ndarray, *, out: np.ndarray | None = None, op: OpLike = "sum",
                   counts: Sequence[int] | None = None, algorithm: str = "ring",
                   comm: MPI.Comm | None = None, validate: bool | None = None,
                   options: Options | None = None) -> np.ndarray:
    """Reduce ``x`` over all ranks and give rank ``r`` block ``r`` of the result (1-D).

    ``counts[r]`` is the length of rank ``r``'s block (``MPI_Reduce_scatter``'s recvcounts); by
    default ``x.size`` is split into near-equal blocks, the first ``x.size % p`` one longer.
    ``algorithm``: "ring" or "native".
    """
    comm, opts, validate = _setup(comm, options, validate)

    def check():
        a = check_input(x)
        the_op = get_op(op, a.dtype)
        fn = _pick(REDUCE_SCATTER, algorithm, "algorithm")
        offsets = _offsets(counts, a.size, comm.size)
        n = int(offsets[comm.rank + 1] - offsets[comm.rank])
        res = new_like(a, (n,)) if out is None else check_out(out, a, (n,))
        sig = {"count": a.size, "dtype": a.dtype, "op": the_op.name,
               "algorithm": algorithm, "counts": tuple(np.diff(offsets).tolist())}
        return (a, the_op, fn, offsets, res), sig

    a, the_op, fn, offsets, res = checked("reduce_scatter", comm, validate, check)
    if a.size == 0 or comm.size == 1:
        copy_into(flat(a), res)
        return res
    fn(flat(a), res, offsets, the_op, context(comm), opts)
    _finish_avg(the_op, res, comm.size)
    return res


def allgather(x: np.ndarray, *, out: np.ndarray | None = None,
              counts: Sequence[int] | None = None, algorithm: str = "ring",
              comm: MPI.Comm | None = None, validate: bool | None = None,
              options: Options | None = None) -> np.ndarray:
    """Concatenate every rank's ``x`` (flattened), in rank order, on every rank (1-D result).

    Without ``counts`` every rank must pass the same number of elements (``MPI_Allgather``); with
    ``counts`` (one per rank, ``counts[rank] == x.size``) blocks may differ (``MPI_Allgatherv``).
    ``algorithm``: "ring" or "native".
    """
    comm, opts, validate = _setup(comm, options, validate)

    def check():
        a = check_input(x)
        fn = _pick(ALLGATHER, algorithm, "algorithm")
        sizes = [a.size] * comm.size if counts is None else counts
        offsets = _offsets(sizes, int(np.sum(sizes)), comm.size)
        if int(offsets[comm.rank + 1] - offsets[comm.rank]) != a.size:
            raise ValueError(f"counts[{comm.rank}] = {offsets[comm.rank + 1] - offsets[comm.rank]}"
                             f" but x has {a.size} elements")
        total = int(offsets[-1])
        res = new_like(a, (total,)) if out is None else check_out(out, a, (total,))
        sig = {"dtype": a.dtype, "algorithm": algorithm,
               "counts": tuple(np.diff(offsets).tolist())}
        return (a, fn, offsets, res), sig

    a, fn, offsets, res = checked("allgather", comm, validate, check)
    if offsets[-1] == 0 or comm.size == 1:
        copy_into(flat(a), res)
        return res
    fn(flat(a), res, offsets, context(comm), opts)
    return res


def bcast(x: np.ndarray, *, root: int = 0, algorithm: str = "binomial",
          comm: MPI.Comm | None = None, validate: bool | None = None,
          options: Options | None = None) -> np.ndarray:
    """Copy ``x`` of rank ``root`` into ``x`` of every rank, in place; returns ``x``.

    ``algorithm``: "binomial" (pipelined in segments) or "native".
    """
    comm, opts, validate = _setup(comm, options, validate)

    def check():
        a = check_input(x)
        r = _check_root(root, comm)
        fn = _pick(BCAST, algorithm, "algorithm")
        if not writeable(a):
            raise ValueError("x is read-only; bcast writes into it on every rank but the root")
        sig = {"count": a.size, "dtype": a.dtype, "root": r, "algorithm": algorithm}
        return (a, r, fn), sig

    a, r, fn = checked("bcast", comm, validate, check)
    if a.size and comm.size > 1:
        fn(flat(a), r, context(comm), opts)
    return a


def reduce(x: np.ndarray, *, out: np.ndarray | None = None, op: OpLike = "sum", root: int = 0,
           algorithm: str = "binomial", comm: MPI.Comm | None = None,
           validate: bool | None = None, options: Options | None = None) -> np.ndarray | None:
    """Reduce ``x`` over all ranks into ``out`` on ``root``.

    Returns the result on ``root`` (a new array when ``out`` is None; ``out=x`` works in place)
    and None on every other rank, where ``out`` is ignored. ``algorithm``: "binomial" or "native".
    """
    comm, opts, validate = _setup(comm, options, validate)

    def check():
        a = check_input(x)
        the_op = get_op(op, a.dtype)
        r = _check_root(root, comm)
        fn = _pick(REDUCE, algorithm, "algorithm")
        res = None
        if comm.rank == r:
            res = new_like(a) if out is None else check_out(out, a)
        sig = {"count": a.size, "dtype": a.dtype, "op": the_op.name, "root": r,
               "algorithm": algorithm}
        return (a, the_op, r, fn, res), sig

    a, the_op, r, fn, res = checked("reduce", comm, validate, check)
    src = flat(a)
    dst = None if res is None else (src if res is a else flat(res))
    if a.size == 0 or comm.size == 1:
        if dst is not None:
            copy_into(src, dst)
        return res
    fn(src, dst, the_op, r, context(comm), opts)
    if dst is not None:
        _finish_avg(the_op, dst, comm.size)
    return res
