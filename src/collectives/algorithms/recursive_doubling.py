"""Recursive doubling allreduce (Thakur, Rabenseifner & Gropp 2005), with the MPICH fold.

After the fold (``pof2.py``) the ``pof2`` remaining ranks run lg pof2 steps: in the step with
distance ``mask`` = 1, 2, 4, ... each rank exchanges its whole vector with ``partner = newrank ^ mask``
and combines the two, the lower new rank's vector first, so both partners compute the same bits.
After the last step every rank holds the full reduction.

Cost: lg p alpha + n lg p beta + n lg p gamma (plus the fold when p is not a power of two). The
fewest messages of all: it wins for short messages, where latency dominates.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._runtime.context import Context
from .._runtime.guard import Guard
from .._runtime.p2p import sendrecv
from .._runtime.workspace import scratch
from ..ops import Op
from ..options import Options
from .pof2 import doubling, folded

__all__ = ["allreduce"]


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    folded(src, buf, op, ctx, _doubling)


def _doubling(buf: np.ndarray, op: Op, comm: MPI.Comm, newrank: int, pof2: int, rem: int,
              guard: Guard | None) -> None:
    tmp = scratch("recursive_doubling", buf.size, buf)
    for partner, peer in doubling(newrank, pof2, rem):
        # whole vector both ways, then combine in rank order
        sendrecv(comm, buf, peer, tmp, peer, guard)
        if partner < newrank:
            op.combine(tmp, buf, buf)
        else:
            op.combine(buf, tmp, buf)
