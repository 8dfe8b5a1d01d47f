"""Ring reduce-scatter and ring allgather: the bandwidth-optimal building blocks.

The ring algorithm works as follows. The vector of ``n`` elements is cut into ``p`` blocks (block
``b`` is ``buf[offsets[b]:offsets[b+1]]``); each rank sends only to its ``right`` neighbour
(rank + 1) and receives only from its ``left`` neighbour (rank - 1).

Reduce-scatter: in step ``step`` = 0 .. p-2, rank ``r`` sends its partial sum of block
``r - 1 - step`` to the right and receives the left neighbour's partial sum of block
``r - 2 - step``, which it combines with its own input of that block. After p-1 steps block
``r`` on rank ``r`` holds the reduction over all ranks. In place the partial sums overwrite
the input; out of place they go to two alternating scratch blocks and the last to the result.
Each block is further cut into ``nseg`` segments of at most ``segment_bytes`` (one message
each), so the scratch buffer ``tmp`` is one segment long.

Allgather: in step ``step`` rank ``r`` sends block ``r - step`` to the right and receives block
``r - 1 - step`` from the left, directly into place. After p-1 steps every rank holds every block.

Cost (Thakur, Rabenseifner & Gropp 2005), n bytes in all:
reduce-scatter (p-1) alpha + n (p-1)/p beta + n (p-1)/p gamma; allgather (p-1) alpha +
n (p-1)/p beta. Segmenting multiplies the alpha term by ``nseg``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from mpi4py import MPI

from .._runtime.guard import Guard
from .._runtime.p2p import sendrecv
from .._runtime.ranks import nsegments, split
from .._runtime.workspace import scratch
from ..ops import Op

__all__ = ["reduce_scatter", "allgather"]


def reduce_scatter(buf: np.ndarray, offsets: Sequence[int], op: Op, comm: MPI.Comm,
                   segment_bytes: int, guard: Guard | None, out: np.ndarray | None = None) -> None:
    """Reduce ``buf`` across ``comm`` so that block ``rank`` ends fully reduced: in place
    (``out`` None; the other blocks of ``buf`` are left holding partial results), or into
    ``out`` (block ``rank``'s length), ``buf`` only read.

    Each block reaches a rank once (block ``r - 2 - step`` in step ``step``), so what is
    combined with the partial sum that arrives is always the rank's own input of that block,
    and what a rank sends in step ``step`` > 0 is what it combined in step ``step - 1``: out
    of place, those partial sums go to two scratch blocks used in turn, and the last one
    straight into ``out``, with the same operands in the same order as in place (the same
    bits), and no copy of the input or of the result.
    """
    p, r = comm.size, comm.rank
    if p == 1:  # nothing to combine: the input is the result
        if out is not None:
            out[...] = buf
        return
    right, left = (r + 1) % p, (r - 1) % p
    longest = max(b - a for a, b in zip(offsets[:-1], offsets[1:]))
    nseg = nsegments(longest, buf.itemsize, segment_bytes)
    tmp = scratch("ring.reduce_scatter", -(-longest // nseg), buf)
    pair = None if out is None else scratch("ring.reduce_scatter.blocks", 2 * longest, buf)
    sent, at = buf, 0  # what the next step sends: block b's elements lie at sent[offsets[b] - at:]
    for step in range(p - 1):
        send_block, recv_block = (r - 1 - step) % p, (r - 2 - step) % p
        if out is None:  # where this step's partial sums go (and the next step sends from)
            into, base = buf, 0
        elif step == p - 2:  # the last: block r, complete
            into, base = out, offsets[recv_block]
        else:
            into, base = pair[(step % 2) * longest:], offsets[recv_block]
        send_segs = split(offsets[send_block], offsets[send_block + 1], nseg)
        recv_segs = split(offsets[recv_block], offsets[recv_block + 1], nseg)
        for sseg, rseg in zip(send_segs, recv_segs):
            # one segment right, the matching segment of the next block in from the left
            t = tmp[: rseg.stop - rseg.start]
            sendrecv(comm, sent[sseg.start - at:sseg.stop - at], right, t, left, guard)
            op.combine(t, buf[rseg], into[rseg.start - base:rseg.stop - base])
        sent, at = into, base


def allgather(buf: np.ndarray, offsets: Sequence[int], comm: MPI.Comm,
              guard: Guard | None) -> None:
    """Given block ``rank`` of ``buf`` on each rank, fill in every other block in place."""
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        send_block, recv_block = (r - step) % p, (r - 1 - step) % p
        # pass on the block received in the previous step (or our own, first)
        sendrecv(comm, buf[offsets[send_block]:offsets[send_block + 1]], right,
                 buf[offsets[recv_block]:offsets[recv_block + 1]], left, guard)
