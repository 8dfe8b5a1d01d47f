"""The dissemination barrier: ceil(log2 p) rounds of zero-byte messages (Hensgen, Finkel &
Manber 1988).

In round ``k`` = 1, 2, 4, ... < p rank ``r`` sends an empty message to ``(r + k) mod p`` and
waits for one from ``(r - k) mod p``. After the round with distance ``k`` a rank has heard,
directly or through a chain, from the ``2k - 1`` ranks before it; after the last it has heard
from all p - 1, so no rank leaves before every rank has arrived. It works for any p (unlike the
butterfly, which needs a power of two).

Cost: ceil(log2 p) alpha. Every wait is the guard's, so a rank that fails elsewhere ends the
barrier with an error on every rank instead of a hang.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._runtime.guard import Guard
from .._runtime.p2p import sendrecv

__all__ = ["barrier"]

_EMPTY = np.empty(0, dtype=np.uint8)


def barrier(comm: MPI.Comm, guard: Guard | None) -> None:
    """Return once every rank of ``comm`` has entered."""
    p, r = comm.size, comm.rank
    k = 1
    while k < p:
        # round k: tell the rank k ahead, hear from the rank k behind
        sendrecv(comm, _EMPTY, (r + k) % p, np.empty(0, dtype=np.uint8), (r - k) % p, guard)
        k <<= 1
