"""Building blocks of the allreduce algorithms, each by name in its own table.

Signatures over flat contiguous arrays (``offsets``: element offset of each rank's block, length
p + 1):

- reduce-scatter ``fn(src, out, offsets, op, ctx, opts)``: ``out`` gets block ``rank`` of the
  reduction of every rank's ``src``;
- allgather ``fn(src, out, offsets, ctx, opts)``: ``out`` gets every rank's ``src`` at its offset;
- broadcast ``fn(buf, root, ctx, opts)``: ``buf`` of ``root`` everywhere, in place;
- reduce ``fn(src, out, op, root, ctx, opts)``: the reduction into ``out`` on ``root`` (``out`` is
  None elsewhere).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .._arrays import copy_into
from .._context import Context
from .._workspace import scratch
from ..ops import Op
from ..options import Options
from . import binomial, native, ring

__all__ = ["REDUCE_SCATTER", "ALLGATHER", "BCAST", "REDUCE"]


def _ring_reduce_scatter(src: np.ndarray, out: np.ndarray, offsets: Sequence[int], op: Op,
                         ctx: Context, opts: Options) -> None:
    work = scratch("blocks.reduce_scatter", src.size, src)
    copy_into(src, work)  # the ring overwrites its input with partial results
    ring.reduce_scatter(work, offsets, op, ctx.comm, opts.segment_bytes)
    r = ctx.comm.rank
    copy_into(work[offsets[r]:offsets[r + 1]], out)


def _ring_allgather(src: np.ndarray, out: np.ndarray, offsets: Sequence[int], ctx: Context,
                    opts: Options) -> None:
    r = ctx.comm.rank
    copy_into(src, out[offsets[r]:offsets[r + 1]])
    ring.allgather(out, offsets, ctx.comm)


def _binomial_bcast(buf: np.ndarray, root: int, ctx: Context, opts: Options) -> None:
    binomial.bcast(buf, root, ctx.comm, opts.segment_bytes)


def _binomial_reduce(src: np.ndarray, out: np.ndarray | None, op: Op, root: int, ctx: Context,
                     opts: Options) -> None:
    acc = out if out is not None else scratch("blocks.reduce", src.size, src)
    copy_into(src, acc)
    binomial.reduce(acc, op, root, ctx.comm, opts.segment_bytes)


REDUCE_SCATTER = {"ring": _ring_reduce_scatter, "native": native.reduce_scatter}
ALLGATHER = {"ring": _ring_allgather, "native": native.allgather}
BCAST = {"binomial": _binomial_bcast, "native": native.bcast}
REDUCE = {"binomial": _binomial_reduce, "native": native.reduce}
