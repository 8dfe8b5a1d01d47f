"""Rabenseifner's allreduce: recursive-halving reduce-scatter + recursive-doubling allgather.

(Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005.) After the fold (``pof2.py``) the vector
is cut into ``pof2`` blocks. Reduce-scatter by recursive halving: in the step with distance
``mask`` = pof2/2, pof2/4, ..., 1, each rank and its ``partner = newrank ^ mask`` split the block
range they share, ``[lo, hi)``, in halves; the rank whose ``mask`` bit is 0 keeps the lower half.
Each sends the half it gives up and combines the half it keeps with what arrives (lower new rank
first). After lg pof2 steps rank ``newrank`` holds block ``newrank`` fully reduced. The allgather
retraces the steps in reverse (mask = 1, 2, ...), each rank sending the range it holds and
receiving its partner's, until every rank has every block.

Cost: 2 lg p alpha + 2 n (p-1)/p beta + n (p-1)/p gamma: ring's bandwidth with recursive
doubling's latency. MPICH's default for medium and large messages.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._runtime.context import Context
from .._runtime.guard import Guard
from .._runtime.p2p import sendrecv
from .._runtime.ranks import partition
from .._runtime.workspace import scratch
from ..ops import Op
from ..options import Options
from .pof2 import folded, halving

__all__ = ["allreduce"]


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    folded(src, buf, op, ctx, _halving_doubling)


def _halving_doubling(buf: np.ndarray, op: Op, comm: MPI.Comm, newrank: int, pof2: int,
                      rem: int, guard: Guard | None) -> None:
    off = partition(buf.size, pof2)
    tmp = scratch("rabenseifner", int(off[pof2 // 2]), buf)  # the largest half
    steps = []  # (peer, kept range, given range) of each halving step, for the allgather
    lo, hi = 0, pof2
    for mask, partner, peer in halving(newrank, pof2, rem):
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if not newrank & mask else ((mid, hi), (lo, mid))
        kept = buf[off[keep[0]]:off[keep[1]]]
        t = tmp[: kept.size]
        # send the half we give up, receive the partner's copy of the half we keep
        sendrecv(comm, buf[off[give[0]]:off[give[1]]], peer, t, peer, guard)
        if partner < newrank:
            op.combine(t, kept, kept)
        else:
            op.combine(kept, t, kept)
        steps.append((peer, keep, give))
        lo, hi = keep
    for peer, keep, give in reversed(steps):
        # send the range we hold, receive the partner's into place
        sendrecv(comm, buf[off[keep[0]]:off[keep[1]]], peer, buf[off[give[0]]:off[give[1]]], peer,
                 guard)
