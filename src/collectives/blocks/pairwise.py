"""Pairwise-exchange alltoall: p - 1 rounds, one block each way per round.

Every rank ``r`` holds p blocks of ``src`` (block ``j``, at ``sendoffsets[j]``, is for rank
``j``) and receives p blocks into ``dst`` (block ``i``, at ``recvoffsets[i]``, from rank ``i``).
Its own block is a local copy. Then in round ``k`` = 1 .. p-1 it exchanges one block with one
partner by a single sendrecv:

- when p is a power of two, the partner is ``r XOR k`` both ways (the pairs of a round are
  disjoint, so every message of a round meets its partner's at once);
- otherwise rank ``r`` sends to ``(r + k) mod p`` and receives from ``(r - k) mod p``.

Both orders are MPICH's for long messages (Thakur, Rabenseifner & Gropp 2005). The blocks may
have any sizes, zero included (``MPI_Alltoallv``); a zero-size block still travels as a
zero-byte message, and every receive expects exactly its block's bytes (``_runtime/p2p.py``).

Cost, with n bytes sent per rank in equal blocks: (p - 1) alpha + (p - 1)/p n beta, no local
copy but the own block. For long blocks that is optimal in beta; for short ones the p - 1
latencies dominate (Bruck, ``bruck.py``, takes ceil(log2 p)).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from mpi4py import MPI

from .._runtime.arrays import copy_into
from .._runtime.guard import Guard
from .._runtime.p2p import sendrecv

__all__ = ["alltoall", "partners"]


def partners(rank: int, p: int, k: int) -> tuple[int, int]:
    """``(to, frm)`` of ``rank`` in round ``k`` (1 .. p-1)."""
    if p & (p - 1) == 0:
        return rank ^ k, rank ^ k
    return (rank + k) % p, (rank - k) % p


def alltoall(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
             recvoffsets: Sequence[int], comm: MPI.Comm, guard: Guard | None) -> None:
    """Send block ``j`` of ``src`` to rank ``j``; receive block ``i`` of ``dst`` from rank ``i``."""
    p, r = comm.size, comm.rank
    copy_into(src[sendoffsets[r]:sendoffsets[r + 1]], dst[recvoffsets[r]:recvoffsets[r + 1]])
    for k in range(1, p):
        to, frm = partners(r, p, k)
        # one block each way: ours for `to`, `frm`'s for us
        sendrecv(comm, src[sendoffsets[to]:sendoffsets[to + 1]], to,
                 dst[recvoffsets[frm]:recvoffsets[frm + 1]], frm, guard)
