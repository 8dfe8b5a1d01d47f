"""Sparse strategy: a SparCML-style sparse allreduce for top-k, threshold and DGC.

Renggli, Ashkboos, Aghagolzadeh, Alistarh & Hoefler, "SparCML: High-Performance Sparse
Communication for Machine Learning", SC 2019. Each rank's payload is turned into a sorted
(index, value) list; partial sums travel sparse and switch to dense once the merged density makes
dense no larger (``_sparsevec.py``). Two variants:

- recursive doubling (``allreduce_recursive_doubling``): the MPICH fold for non-powers of two, then
  lg p steps in which partners swap their whole partial sums and merge them (lower rank first), so
  both compute the same bits. Cost: lg p alpha plus, with k nonzeros per rank and little overlap,
  about sum_s min(2^s k (4 + S), n S) beta: latency-optimal, for small vectors.
- split (``allreduce_split``): the vector's index range is cut into p ranges; an all-to-all sends
  each rank's entries in range j to rank j, which merges them in rank order; an allgather returns
  every range (sparse or dense). Cost: 2 (p-1) alpha + about 2 k (4 + S) beta per rank while
  sparse: bandwidth-friendly for large vectors.

``allreduce`` picks recursive doubling up to ``SPLIT_BYTES`` of dense data or p <= 2, and the
split variant above.
"""

from __future__ import annotations

import numpy as np

from compress.arrays import host_copy
from compress.protocols import SparsePayload

from .._runtime.arrays import xp
from .._runtime.context import Context
from ..options import Options
from .._runtime.p2p import recv, send, sendrecv
from .._runtime.ranks import partition
from ..algorithms.pof2 import doubling, fold
from ._exchange import allgatherv, alltoallv
from .coding import TensorCoding
from ._sparsevec import SparseVec, combine, pack, unpack

__all__ = ["allreduce", "allreduce_recursive_doubling", "allreduce_split", "SPLIT_BYTES"]

SPLIT_BYTES = 256 << 10


def _local(x: np.ndarray, coding: TensorCoding) -> SparseVec:
    """This rank's contribution as a sorted sparse list, from its payload.

    For a device ``x`` the codec runs on the device and only the (index, value) lists come to the
    host, where the lists are merged."""
    payload = coding.encode(x)
    if isinstance(coding.codec, SparsePayload):  # (index, value) lists from the payload, validated
        idx, vals = coding.codec.sparse_parts(payload, count=x.size)
    else:  # any other codec: decode, keep the nonzeros
        dense = coding.decode(payload, x.size)
        idx = xp(dense).flatnonzero(dense)
        vals = dense[idx]
    idx, vals = host_copy(idx), host_copy(vals)
    return SparseVec(0, x.size, _acc(x), idx, vals.astype(_acc(x))).balanced()


def _acc(x: np.ndarray) -> np.dtype:
    """Partial sums travel in at least float32 (Numba kernels do no float16 arithmetic)."""
    return np.result_type(x.dtype, np.float32)


def _swap(ctx: Context, v: SparseVec, partner: int) -> SparseVec:
    """Exchange partial sums with ``partner`` (sizes first, then the bytes)."""
    out = pack(v)
    size = np.empty(1, np.int64)
    sendrecv(ctx.comm, np.array([out.size], np.int64), partner, size, partner, ctx.active)
    got = np.empty(int(size[0]), np.uint8)
    sendrecv(ctx.comm, out, partner, got, partner, ctx.active)
    return unpack(got, v.lo, v.length, v.dtype)


def _send(ctx: Context, v: SparseVec, dest: int) -> None:
    out = pack(v)
    send(ctx.comm, np.array([out.size], np.int64), dest, ctx.active)
    send(ctx.comm, out, dest, ctx.active)


def _recv(ctx: Context, source: int, like: SparseVec) -> SparseVec:
    size = np.empty(1, np.int64)
    recv(ctx.comm, size, source, ctx.active)
    got = np.empty(int(size[0]), np.uint8)
    recv(ctx.comm, got, source, ctx.active)
    return unpack(got, like.lo, like.length, like.dtype)


def allreduce_recursive_doubling(x: np.ndarray, out: np.ndarray, coding: TensorCoding, ctx: Context,
                                 opts: Options, algorithm: str) -> None:
    f = fold(ctx.comm.rank, ctx.comm.size)
    v = _local(x, coding)
    # the fold (algorithms/pof2.py): a rank that sits out hands its list over and gets the result
    if f.sits_out:
        _send(ctx, v, f.partner)
        v = _recv(ctx, f.partner, v)
    else:
        if f.absorbs:
            v = combine(_recv(ctx, f.partner, v), v)
        for partner, peer in doubling(f.newrank, f.pof2, f.rem):
            other = _swap(ctx, v, peer)
            v = combine(other, v) if partner < f.newrank else combine(v, other)
        if f.absorbs:
            _send(ctx, v, f.partner)
    acc = coding.accumulator(out, _acc(x))
    v.write_into(acc)
    coding.finish(acc, coding.world, out)


def allreduce_split(x: np.ndarray, out: np.ndarray, coding: TensorCoding, ctx: Context,
                    opts: Options, algorithm: str) -> None:
    comm = ctx.comm
    p, r = comm.size, comm.rank
    bounds = partition(x.size, p)
    v = _local(x, coding)
    if v.dense is not None:  # already dense: cut it into plain slices
        parts = [SparseVec(bounds[k], bounds[k + 1] - bounds[k], v.dtype,
                           dense=v.dense[bounds[k]:bounds[k + 1]]) for k in range(p)]
    else:
        parts = [part.balanced() for part in v.split(bounds)]
    # all-to-all: range j to rank j, which sums the p pieces in rank order
    got = alltoallv([pack(part) for part in parts], ctx)
    mine = [unpack(g, bounds[r], bounds[r + 1] - bounds[r], v.dtype) for g in got]
    total = mine[0]
    for piece in mine[1:]:
        total = combine(total, piece)
    # allgather: every finished range to every rank
    acc = coding.accumulator(out, v.dtype)
    for k, g in enumerate(allgatherv(pack(total.balanced()), ctx)):
        unpack(g, bounds[k], bounds[k + 1] - bounds[k], v.dtype).write_into(acc)
    coding.finish(acc, coding.world, out)


def allreduce(x: np.ndarray, out: np.ndarray, coding: TensorCoding, ctx: Context, opts: Options,
              algorithm: str) -> None:
    variant = allreduce_recursive_doubling if x.nbytes <= SPLIT_BYTES or ctx.comm.size <= 2 \
        else allreduce_split
    variant(x, out, coding, ctx, opts, algorithm)
