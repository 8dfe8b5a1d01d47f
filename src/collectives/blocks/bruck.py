"""Bruck's alltoall: ceil(log2 p) rounds, for short equal blocks (Bruck et al. 1997).

Every rank holds p equal blocks of ``block`` elements in ``src`` (block ``j`` for rank ``j``)
and works on a scratch copy ``tmp`` of them, in three phases:

1. rotate: ``tmp`` block ``i`` = ``src`` block ``(r + i) mod p``, so block ``i`` is the one
   that must travel ``i`` ranks forward;
2. rounds ``k`` = 1, 2, 4, ... < p: every block ``i`` of ``tmp`` with bit ``k`` set is packed
   into ``sendbuf``, sent to rank ``(r + k) mod p``, and replaced by the blocks received from
   rank ``(r - k) mod p`` (the same positions there). A block that must travel ``i`` ranks
   moves once per set bit of ``i``; after the last round ``tmp`` block ``i`` holds the block
   that rank ``(r - i) mod p`` sent to ``r``;
3. unrotate: ``dst`` block ``(r - i) mod p`` = ``tmp`` block ``i``.

Cost, with n bytes per rank (p blocks): ceil(log2 p) alpha + ceil(log2 p) n/2 beta, plus about
ceil(log2 p) n/2 bytes of packing and two n-byte copies. Fewer latencies than pairwise
(``pairwise.py``: p - 1), more bytes: MPICH takes it for blocks up to 256 bytes. It needs equal
blocks; the v form (``counts=``) declines it.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._runtime.guard import Guard
from .._runtime.p2p import sendrecv
from .._runtime.workspace import scratch

__all__ = ["alltoall"]


def alltoall(src: np.ndarray, dst: np.ndarray, block: int, comm: MPI.Comm,
             guard: Guard | None) -> None:
    """Send block ``j`` of ``src`` (``block`` elements each) to rank ``j``; receive block ``i``
    of ``dst`` from rank ``i``. ``src`` and ``dst`` may be the same array."""
    p, r = comm.size, comm.rank
    n = p * block
    tmp = scratch("bruck.tmp", n, src)
    half = (p // 2 + 1) * block  # the most blocks a round sends: those with bit k set
    sendbuf = scratch("bruck.send", half, src)
    recvbuf = scratch("bruck.recv", half, src)
    # 1. rotate r blocks up
    s = r * block
    tmp[:n - s] = src[s:]
    tmp[n - s:] = src[:s]
    t = tmp.reshape(p, block)
    k = 1
    while k < p:
        runs = [(i, min(i + k, p)) for i in range(k, p, 2 * k)]  # the blocks with bit k set
        m = 0
        for a, b in runs:  # pack
            sendbuf[m * block:(m + b - a) * block] = tmp[a * block:b * block]
            m += b - a
        # 2. round k: the blocks with bit k set travel k ranks forward
        sendrecv(comm, sendbuf[:m * block], (r + k) % p, recvbuf[:m * block], (r - k) % p,
                 guard)
        m = 0
        for a, b in runs:  # unpack into the same positions
            tmp[a * block:b * block] = recvbuf[m * block:(m + b - a) * block]
            m += b - a
        k <<= 1
    # 3. unrotate: dst block j = tmp block (r - j) mod p
    d = dst.reshape(p, block)
    d[:r + 1] = t[r::-1]
    d[r + 1:] = t[:r:-1]
