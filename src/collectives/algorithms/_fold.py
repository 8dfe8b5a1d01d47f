"""The MPICH fold that lets power-of-two algorithms run on any number of ranks.

With ``pof2`` the largest power of two <= p and ``rem = p - pof2``: among the first ``2 rem``
ranks, each even rank sends its whole vector to the odd rank above it and sits out; the odd rank
combines (even first, keeping rank order) and becomes rank ``rank // 2`` of the power-of-two group;
ranks >= 2 rem become ``rank - rem``. After the power-of-two algorithm each odd rank sends the
result back to its even partner. Cost: 2 (alpha + n beta) + n gamma extra when rem > 0.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from typing import Callable

from .._arrays import copy_into
from .._p2p import recv, send
from .._workspace import scratch
from ..ops import Op

__all__ = ["pof2_of", "fold_in", "fold_out", "real_rank", "folded"]


def pof2_of(p: int) -> int:
    """Largest power of two <= p."""
    return 1 << (p.bit_length() - 1)


def real_rank(newrank: int, rem: int) -> int:
    """The communicator rank playing ``newrank`` in the power-of-two group."""
    return newrank * 2 + 1 if newrank < rem else newrank + rem


def fold_in(buf: np.ndarray, op: Op, comm: MPI.Comm) -> int:
    """Fold the extra ranks in; return this rank's new rank, or -1 if it sits out."""
    rank, rem = comm.rank, comm.size - pof2_of(comm.size)
    if rank >= 2 * rem:
        return rank - rem
    if rank % 2 == 0:
        send(comm, buf, rank + 1)
        return -1
    tmp = scratch("fold", buf.size, buf)
    recv(comm, tmp, rank - 1)
    op.combine(tmp, buf, buf)
    return rank // 2


def fold_out(buf: np.ndarray, comm: MPI.Comm) -> None:
    """Return the finished result to the ranks that sat out."""
    rank, rem = comm.rank, comm.size - pof2_of(comm.size)
    if rank < 2 * rem:
        if rank % 2 == 0:
            recv(comm, buf, rank + 1)
        else:
            send(comm, buf, rank - 1)


def folded(src: np.ndarray, buf: np.ndarray, op: Op, comm: MPI.Comm,
           body: Callable[[np.ndarray, Op, MPI.Comm, int, int, int], None]) -> None:
    """Allreduce ``src`` into ``buf`` with a power-of-two algorithm on any number of ranks.

    Copies ``src`` into ``buf``, folds the extra ranks in, runs ``body(buf, op, comm, newrank,
    pof2, rem)`` on the ranks of the power-of-two group, and folds the result back out.
    """
    copy_into(src, buf)
    pof2 = pof2_of(comm.size)
    newrank = fold_in(buf, op, comm)
    if newrank >= 0:
        body(buf, op, comm, newrank, pof2, comm.size - pof2)
    fold_out(buf, comm)
