"""Ring reduce-scatter and ring allgather: the bandwidth-optimal building blocks.

The ring algorithm works as follows. The vector of ``n`` elements is cut into ``p`` blocks (block
``b`` is ``buf[offsets[b]:offsets[b+1]]``); each rank sends only to its ``right`` neighbour
(rank + 1) and receives only from its ``left`` neighbour (rank - 1).

Reduce-scatter: in step ``step`` = 0 .. p-2, rank ``r`` sends its partial sum of block
``r - 1 - step`` to the right and receives the left neighbour's partial sum of block
``r - 2 - step``, which it combines into its own copy. After p-1 steps block ``r`` on rank ``r``
holds the reduction over all ranks. Each block is further cut into ``nseg`` segments of at most
``segment_bytes`` (one message each), so the scratch buffer ``tmp`` is one segment long.

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
                   segment_bytes: int, guard: Guard | None) -> None:
    """Reduce ``buf`` across ``comm`` in place so that block ``rank`` ends fully reduced.

    Other blocks of ``buf`` are left holding partial results.
    """
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    longest = max(b - a for a, b in zip(offsets[:-1], offsets[1:]))
    nseg = nsegments(longest, buf.itemsize, segment_bytes)
    tmp = scratch("ring.reduce_scatter", -(-longest // nseg), buf)
    for step in range(p - 1):
        send_block, recv_block = (r - 1 - step) % p, (r - 2 - step) % p
        send_segs = split(offsets[send_block], offsets[send_block + 1], nseg)
        recv_segs = split(offsets[recv_block], offsets[recv_block + 1], nseg)
        for sseg, rseg in zip(send_segs, recv_segs):
            # one segment right, the matching segment of the next block in from the left
            t = tmp[: rseg.stop - rseg.start]
            sendrecv(comm, buf[sseg], right, t, left, guard)
            op.combine(t, buf[rseg], buf[rseg])


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
