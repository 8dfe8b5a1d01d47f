"""The MPI library's own reduce-scatter, allgather, broadcast, reduce, alltoall(v), barrier,
gather(v) and scatter(v), as references.

Same signatures as the hand-written blocks (``handwritten.py``), which replace them once a failure
has retired native on the communicator (``_runtime/guard.py``); offsets are element offsets of each
rank's block. Under a guard each receives into a landing buffer of its own and copies it out
(see ``algorithms/native.py``: an abandoned operation must never write into the caller's array).
Each first makes sure that every rank passes the same signature (count, dtype, op, root, block
counts: ``_runtime/agree.py``), checked together whenever it differs from the last one agreed on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from mpi4py import MPI

from .._runtime import device as _device
from .._runtime.agree import agree, key
from .._runtime.context import Context
from .._runtime.arrays import copy_into, xp
from .._runtime.guard import native_call
from .._runtime.mpitypes import native_op, native_type
from ..ops import Op
from ..options import Options
from .._runtime.workspace import scratch
from .handwritten import (binomial_bcast, binomial_gather, binomial_reduce, binomial_scatter,
                          dissemination_barrier, pairwise_alltoall, ring_allgather,
                          ring_reduce_scatter)

__all__ = ["reduce_scatter", "allgather", "bcast", "reduce", "alltoall", "barrier", "gather",
           "scatter"]


def _landing(out: np.ndarray | None, ctx: Context,
             src: np.ndarray | None = None) -> np.ndarray | None:
    """Where MPI receives instead of ``out``: ``out`` itself outside a public call, unless it
    overlaps the input ``src`` (an in-place reduce-scatter or allgather: MPI's buffers may not
    alias)."""
    if out is None or (ctx.active is None and (src is None or not _overlap(out, src))):
        return out
    return scratch("native.landing", out.size, out)


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(xp(a).may_share_memory(a, b))


def _agreed(ctx: Context, sig: tuple) -> None:
    """Check ``sig`` with the other ranks unless it is the one agreed on last."""
    if ctx.agreed is not sig:
        agree(ctx, sig)
    elif ctx.active is not None:  # repeated without a check: unless another rank checks it
        ctx.active.skip_check()


def _land(ran: bool, land: np.ndarray | None, out: np.ndarray | None) -> None:
    if ran and land is not out:
        copy_into(land, out)


@_device.staged(0, 1)
def reduce_scatter(src: np.ndarray, out: np.ndarray, offsets: Sequence[int], op: Op, ctx: Context,
                   opts: Options) -> None:
    dtype = native_type(src.dtype)
    counts = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    _agreed(ctx, key("reduce_scatter", src.size, src.dtype, op.name, counts=tuple(counts)))
    land = _landing(out, ctx, src)
    _land(native_call(ctx, "Reduce_scatter",
                      ([src, dtype], [land, dtype], counts, native_op(op, src.dtype)),
                      lambda: ring_reduce_scatter(src, out, offsets, op, ctx, opts),
                      ("native.landing", land)), land, out)


@_device.staged(0, 1)
def allgather(src: np.ndarray, out: np.ndarray, offsets: Sequence[int], ctx: Context,
              opts: Options) -> None:
    size = out.itemsize
    # the blocks' counts, not this rank's own count: the blocks may differ (Allgatherv)
    _agreed(ctx, key("allgather", None, src.dtype,
                     counts=tuple(b - a for a, b in zip(offsets[:-1], offsets[1:]))))
    counts = [(b - a) * size for a, b in zip(offsets[:-1], offsets[1:])]
    displs = [a * size for a in offsets[:-1]]
    land = _landing(out, ctx, src)
    _land(native_call(ctx, "Allgatherv", ([src, MPI.BYTE], [land, (counts, displs), MPI.BYTE]),
                      lambda: ring_allgather(src, out, offsets, ctx, opts),
                      ("native.landing", land)), land, out)


@_device.staged(0)
def bcast(buf: np.ndarray, root: int, ctx: Context, opts: Options) -> None:
    _agreed(ctx, key("bcast", buf.size, buf.dtype, root=root))
    land = buf if ctx.comm.rank == root else _landing(buf, ctx)
    _land(native_call(ctx, "Bcast", ([land, MPI.BYTE], root),
                      lambda: binomial_bcast(buf, root, ctx, opts),
                      ("native.landing", land)), land, buf)


@_device.staged(0, 1)
def reduce(src: np.ndarray, out: np.ndarray | None, op: Op, root: int, ctx: Context,
           opts: Options) -> None:
    _agreed(ctx, key("reduce", src.size, src.dtype, op.name, root))
    dtype = native_type(src.dtype)
    land = _landing(out, ctx)
    recv = [land, dtype] if land is not None else None
    _land(native_call(ctx, "Reduce", ([src, dtype], recv, native_op(op, src.dtype), root),
                      lambda: binomial_reduce(src, out, op, root, ctx, opts),
                      ("native.landing", land)), land, out)


def _bytes(offsets: Sequence[int], size: int) -> tuple[list[int], list[int]]:
    """Byte counts and displacements of the blocks at element ``offsets``."""
    return ([(b - a) * size for a, b in zip(offsets[:-1], offsets[1:])],
            [a * size for a in offsets[:-1]])


def _counts(offsets: Sequence[int]) -> tuple:
    return tuple(int(b - a) for a, b in zip(offsets[:-1], offsets[1:]))


@_device.staged(0, 1)
def alltoall(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
             recvoffsets: Sequence[int] | None, ctx: Context, opts: Options) -> None:
    # equal blocks: the count must agree; the v form's receive counts were learned from the
    # senders (api.AlltoallCall), so only the dtype can differ
    _agreed(ctx, key("alltoall", src.size if recvoffsets is None else None, src.dtype))
    size = src.itemsize
    send = _bytes(sendoffsets, size)
    recv = send if recvoffsets is None else _bytes(recvoffsets, size)
    land = _landing(dst, ctx)
    _land(native_call(ctx, "Alltoallv", ([src, send, MPI.BYTE], [land, recv, MPI.BYTE]),
                      lambda: pairwise_alltoall(src, dst, sendoffsets, recvoffsets, ctx, opts),
                      ("native.landing", land)), land, dst)


def barrier(ctx: Context, opts: Options) -> None:
    native_call(ctx, "Barrier", (), lambda: dissemination_barrier(ctx, opts))


@_device.staged(0, 1)
def gather(src: np.ndarray, out: np.ndarray | None, offsets: Sequence[int], root: int,
           ctx: Context, opts: Options) -> None:
    _agreed(ctx, key("gather", None, src.dtype, root=root, counts=_counts(offsets)))
    land = _landing(out, ctx)
    recv = None if land is None else [land, _bytes(offsets, out.itemsize), MPI.BYTE]
    _land(native_call(ctx, "Gatherv", ([src, MPI.BYTE], recv, root),
                      lambda: binomial_gather(src, out, offsets, root, ctx, opts),
                      ("native.landing", land)), land, out)


@_device.staged(0, 1)
def scatter(src: np.ndarray | None, out: np.ndarray, offsets: Sequence[int], root: int,
            ctx: Context, opts: Options) -> None:
    _agreed(ctx, key("scatter", None, out.dtype, root=root, counts=_counts(offsets)))
    land = _landing(out, ctx)
    send = None if src is None else [src, _bytes(offsets, src.itemsize), MPI.BYTE]
    _land(native_call(ctx, "Scatterv", (send, [land, MPI.BYTE], root),
                      lambda: binomial_scatter(src, out, offsets, root, ctx, opts),
                      ("native.landing", land)), land, out)
