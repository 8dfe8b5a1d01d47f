"""The power-of-two schedule: MPICH's fold, and the partners of recursive doubling and halving.

Power-of-two algorithms (recursive doubling, Rabenseifner, the sparse allreduce) run on any number
of ranks through the fold. With ``pof2`` the largest power of two <= p and ``rem = p - pof2``: among
the first ``2 rem`` ranks, each even rank sends its whole vector to the odd rank above it and sits
out; the odd rank combines (even first, keeping rank order) and becomes rank ``rank // 2`` of the
power-of-two group; ranks >= 2 rem become ``rank - rem``. After the power-of-two algorithm each odd
rank sends the result back to its even partner. Cost: 2 (alpha + n beta) + n gamma extra when
rem > 0.

Inside the group, step ``s`` pairs new rank ``newrank`` with ``partner = newrank ^ mask``: recursive
doubling takes ``mask`` = 1, 2, 4, ... (:func:`doubling`), recursive halving ``mask`` = pof2/2, ...,
1 (:func:`halving`); :func:`real_rank` maps a new rank back to its communicator rank.

:func:`fold` describes one rank's part in the fold (no messages); :func:`fold_in`,
:func:`fold_out` and :func:`folded` run it on dense vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from mpi4py import MPI

from .._runtime.arrays import copy_into
from .._runtime.ranks import pof2_of, real_rank
from .._runtime.context import Context
from .._runtime.guard import Guard
from .._runtime.p2p import recv, send
from .._runtime.workspace import scratch
from ..ops import Op

__all__ = ["Fold", "fold", "doubling", "halving", "fold_in", "fold_out", "folded"]


@dataclass(frozen=True)
class Fold:
    """One rank's part in the fold of ``size`` ranks onto ``pof2``."""

    pof2: int
    rem: int
    newrank: int          # rank in the power-of-two group; -1 for a rank that sits out
    partner: int | None   # the rank it hands its vector to (sits out) or takes one from (absorbs)

    @property
    def sits_out(self) -> bool:
        return self.newrank < 0

    @property
    def absorbs(self) -> bool:
        return self.partner is not None and self.newrank >= 0


def fold(rank: int, size: int) -> Fold:
    """The part of ``rank`` in the fold of ``size`` ranks."""
    pof2 = pof2_of(size)
    rem = size - pof2
    if rank >= 2 * rem:
        return Fold(pof2, rem, rank - rem, None)
    if rank % 2 == 0:
        return Fold(pof2, rem, -1, rank + 1)
    return Fold(pof2, rem, rank // 2, rank - 1)


def doubling(newrank: int, pof2: int, rem: int) -> list[tuple[int, int]]:
    """Recursive doubling's steps: ``(partner, peer)`` for mask = 1, 2, 4, ... < pof2, with
    ``partner = newrank ^ mask`` and ``peer`` its communicator rank."""
    steps = []
    mask = 1
    while mask < pof2:
        partner = newrank ^ mask
        steps.append((partner, real_rank(partner, rem)))
        mask <<= 1
    return steps


def halving(newrank: int, pof2: int, rem: int) -> list[tuple[int, int, int]]:
    """Recursive halving's steps: ``(mask, partner, peer)`` for mask = pof2/2, ..., 1."""
    steps = []
    mask = pof2 >> 1
    while mask:
        partner = newrank ^ mask
        steps.append((mask, partner, real_rank(partner, rem)))
        mask >>= 1
    return steps


def fold_in(buf: np.ndarray, op: Op, comm: MPI.Comm, guard: Guard | None) -> int:
    """Fold the extra ranks in; return this rank's new rank, or -1 if it sits out."""
    f = fold(comm.rank, comm.size)
    if f.sits_out:
        send(comm, buf, f.partner, guard)
    elif f.absorbs:
        tmp = scratch("fold", buf.size, buf)
        recv(comm, tmp, f.partner, guard)
        op.combine(tmp, buf, buf)
    return f.newrank


def fold_out(buf: np.ndarray, comm: MPI.Comm, guard: Guard | None) -> None:
    """Return the finished result to the ranks that sat out."""
    f = fold(comm.rank, comm.size)
    if f.sits_out:
        recv(comm, buf, f.partner, guard)
    elif f.absorbs:
        send(comm, buf, f.partner, guard)


def folded(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context,
           body: Callable[[np.ndarray, Op, MPI.Comm, int, int, int, Guard | None], None]) -> None:
    """Allreduce ``src`` into ``buf`` with a power-of-two algorithm on any number of ranks.

    Copies ``src`` into ``buf``, folds the extra ranks of ``ctx.comm`` in, runs ``body(buf, op,
    comm, newrank, pof2, rem, guard)`` on the ranks of the power-of-two group, and folds the
    result back out; ``guard``: the call's (``ctx.active``).
    """
    comm, guard = ctx.comm, ctx.active
    copy_into(src, buf)
    pof2 = pof2_of(comm.size)
    newrank = fold_in(buf, op, comm, guard)
    if newrank >= 0:
        body(buf, op, comm, newrank, pof2, comm.size - pof2, guard)
    fold_out(buf, comm, guard)
