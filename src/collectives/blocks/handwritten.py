"""The hand-written blocks behind the names of the block tables ("ring", "binomial", "pairwise",
"bruck", "dissemination").

Thin adapters from the table signatures (``blocks/__init__.py``) to the schedules in ``ring.py``,
``binomial.py``, ``pairwise.py``, ``bruck.py`` and ``dissemination.py``; ``native.py`` falls back
on them once native is retired (``_runtime/guard.py``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from compress.arrays import same_memory

from .._runtime.arrays import copy_into
from .._runtime.context import Context
from .._runtime.workspace import scratch
from ..ops import Op
from ..options import Options
from . import binomial, bruck, dissemination, pairwise, ring

__all__ = ["ring_reduce_scatter", "ring_allgather", "binomial_bcast", "binomial_reduce",
           "pairwise_alltoall", "bruck_alltoall", "dissemination_barrier", "binomial_gather",
           "binomial_scatter"]


def ring_reduce_scatter(src: np.ndarray, out: np.ndarray, offsets: Sequence[int], op: Op,
                         ctx: Context, opts: Options) -> None:
    r = ctx.comm.rank
    inplace = same_memory(out, src[offsets[r]:offsets[r + 1]])  # src is then the work buffer
    ring.reduce_scatter(src, offsets, op, ctx.comm, opts.segment_bytes, ctx.active,
                        None if inplace else out)


def ring_allgather(src: np.ndarray, out: np.ndarray, offsets: Sequence[int], ctx: Context,
                    opts: Options) -> None:
    r = ctx.comm.rank
    mine = out[offsets[r]:offsets[r + 1]]
    if not same_memory(src, mine):  # (in place: there already)
        copy_into(src, mine)
    ring.allgather(out, offsets, ctx.comm, ctx.active)


def binomial_bcast(buf: np.ndarray, root: int, ctx: Context, opts: Options) -> None:
    binomial.bcast(buf, root, ctx.comm, opts.segment_bytes, ctx.active)


def binomial_reduce(src: np.ndarray, out: np.ndarray | None, op: Op, root: int, ctx: Context,
                     opts: Options) -> None:
    acc = out if out is not None else scratch("blocks.reduce", src.size, src)
    copy_into(src, acc)
    binomial.reduce(acc, op, root, ctx.comm, opts.segment_bytes, ctx.active)


def pairwise_alltoall(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
                      recvoffsets: Sequence[int] | None, ctx: Context, opts: Options) -> None:
    pairwise.alltoall(src, dst, sendoffsets, sendoffsets if recvoffsets is None else recvoffsets,
                      ctx.comm, ctx.active)


def bruck_alltoall(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
                   recvoffsets: Sequence[int] | None, ctx: Context, opts: Options) -> None:
    if recvoffsets is not None:
        raise ValueError("bruck needs equal blocks (alltoall without counts=); "
                         "use pairwise or native")
    bruck.alltoall(src, dst, int(sendoffsets[1] - sendoffsets[0]), ctx.comm, ctx.active)


def dissemination_barrier(ctx: Context, opts: Options) -> None:
    dissemination.barrier(ctx.comm, ctx.active)


def vrank_offsets(offsets: Sequence[int], root: int) -> list[int]:
    """The block offsets in vrank order (vrank ``v`` is rank ``(v + root) mod p``): the blocks
    of ranks root .. p-1, then those of ranks 0 .. root-1."""
    total, start = int(offsets[-1]), int(offsets[root])
    return [int(a) - start for a in offsets[root:]] + [int(a) + total - start
                                                          for a in offsets[1:root + 1]]


def _tree(offsets: Sequence[int], root: int, ctx: Context) -> tuple:
    """``(comm, p, vrank, voffsets, children)`` of this rank in the binomial tree rooted at
    ``root`` that a gather or a scatter of blocks at ``offsets`` runs on."""
    comm = ctx.comm
    p = comm.size
    vrank = (comm.rank - root) % p
    _, children = binomial.tree(vrank, p)
    return comm, p, vrank, vrank_offsets(offsets, root), children


def binomial_gather(src: np.ndarray, out: np.ndarray | None, offsets: Sequence[int], root: int,
                    ctx: Context, opts: Options) -> None:
    comm, p, vrank, voffsets, children = _tree(offsets, root, ctx)
    if out is not None and root == 0:
        work = out  # vrank order is rank order
    elif not children:
        work = src  # a leaf sends its own block as it is
    else:
        base = voffsets[vrank]
        work = scratch("blocks.gather", voffsets[vrank + binomial.subtree(vrank, p)] - base, src)
    if work is not src:
        copy_into(src, work[:src.size])
    binomial.gather(work, voffsets, root, comm, ctx.active)
    if out is not None and work is not out:  # unrotate: vranks 0 .. are ranks root ..
        cut = int(offsets[-1] - offsets[root])
        copy_into(work[:cut], out[offsets[root]:])
        copy_into(work[cut:], out[:offsets[root]])


def binomial_scatter(src: np.ndarray | None, out: np.ndarray, offsets: Sequence[int], root: int,
                     ctx: Context, opts: Options) -> None:
    comm, p, vrank, voffsets, children = _tree(offsets, root, ctx)
    if src is not None:  # the root: its blocks in vrank order
        if root == 0:
            work = src
        else:
            work = scratch("blocks.scatter", src.size, src)
            cut = int(offsets[-1] - offsets[root])
            copy_into(src[offsets[root]:], work[:cut])
            copy_into(src[:offsets[root]], work[cut:])
    elif not children:
        work = out  # a leaf receives its own block only
    else:
        base = voffsets[vrank]
        work = scratch("blocks.scatter", voffsets[vrank + binomial.subtree(vrank, p)] - base, out)
    binomial.scatter(work, voffsets, root, comm, ctx.active)
    if work is not out:
        copy_into(work[:out.size], out)
