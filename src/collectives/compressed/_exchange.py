"""Variable-size byte exchanges for compressed payloads: allgatherv and alltoallv.

Sizes travel first, then the payloads, all through the library's own counted point-to-point messages
(so every wait is the call's guarded one, ``_runtime/guard.py``): a ring allgather of the sizes and
then of the payloads (``blocks/ring.py``), and a pairwise alltoallv (in step ``s`` = 1 .. p-1 rank
``r`` sends to ``r + s`` and receives from ``r - s``, 8 bytes of size then the payload; the order
MPICH uses for long messages).
"""

from __future__ import annotations

import numpy as np

from .._runtime.arrays import xp
from .._runtime.context import Context
from .._runtime.p2p import sendrecv
from ..blocks import ring

__all__ = ["allgatherv", "alltoallv"]


def allgatherv(payload: np.ndarray, ctx: Context) -> list[np.ndarray]:
    """Every rank's uint8 ``payload``, in rank order, on every rank (on the payload's device)."""
    comm, guard = ctx.comm, ctx.active
    p, r = comm.size, comm.rank
    sizes = np.empty(p, dtype=np.int64)
    sizes[r] = payload.size
    ring.allgather(sizes, list(range(p + 1)), comm, guard)
    offsets = [0] + np.cumsum(sizes).tolist()
    buf = xp(payload).empty(offsets[-1], dtype=np.uint8)
    buf[offsets[r]:offsets[r + 1]] = payload
    ring.allgather(buf, offsets, comm, guard)
    return [buf[offsets[k]:offsets[k + 1]] for k in range(p)]


def alltoallv(chunks: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    """Send uint8 ``chunks[k]`` to rank ``k``; return what each rank sent here, by source."""
    comm, guard = ctx.comm, ctx.active
    p, r = comm.size, comm.rank
    lib = xp(chunks[r])
    received: list[np.ndarray] = [chunks[r]] * p
    size = np.empty(1, dtype=np.int64)
    for step in range(1, p):
        dst, src = (r + step) % p, (r - step) % p
        sendrecv(comm, np.array([chunks[dst].size], dtype=np.int64), dst, size, src, guard)
        received[src] = lib.empty(int(size[0]), dtype=np.uint8)
        sendrecv(comm, chunks[dst], dst, received[src], src, guard)
    return received
