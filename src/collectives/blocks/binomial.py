"""Binomial-tree reduce and broadcast, pipelined in segments; binomial gather and scatter.

The binomial tree works on ranks renumbered relative to the root, ``vrank = (rank - root) mod p``.
Rank ``vrank`` has a ``parent`` at ``vrank - mask`` where ``mask`` is the lowest set bit of
``vrank`` (the root has none), and ``children`` at ``vrank + m`` for every power of two ``m`` below
that bit with ``vrank + m < p``. Child ``vrank + m`` roots the subtree of ranks
``vrank + m .. vrank + 2m - 1``.

Reduce: for each segment, receive each child's partial result in increasing ``m`` and combine it
after our own (``acc (op) child``, keeping operands in rank order), then send to the parent.
Broadcast: for each segment, receive from the parent, then send to the children, largest subtree
first. Segments make the tree a pipeline: while a parent combines segment k its children already
work on segment k+1.

Cost for n bytes in one segment: lg p alpha + n lg p beta (+ n lg p gamma for reduce). With
``nseg`` segments of size s: about (lg p + nseg - 1)(alpha + s beta), so large messages approach
n beta per direction.

Gather and scatter move blocks of any sizes (``MPI_Gatherv``/``MPI_Scatterv``) through the same
tree, unsegmented, in a buffer ordered by vrank (``voffsets``: element offsets of the blocks of
vranks 0 .. p-1), in which the subtree of ``vrank`` is one contiguous range. Gather: receive
each child's subtree range, then send the whole own range to the parent. Scatter: receive the
own range from the parent, then send each child its subtree's range, largest first. Cost for n
bytes gathered in all: lg p alpha + (p - 1)/p n beta (the root receives all but its own block,
in lg p messages of n/2, n/4, ... bytes).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._runtime.guard import Guard
from .._runtime.p2p import recv, send
from .._runtime.ranks import nsegments, split
from .._runtime.workspace import scratch
from ..ops import Op

__all__ = ["tree", "subtree", "reduce", "bcast", "gather", "scatter"]


def tree(vrank: int, p: int) -> tuple[int | None, list[int]]:
    """``(parent, children)`` of ``vrank`` in the binomial tree over ``p`` ranks rooted at 0."""
    mask = 1
    while mask < p and not vrank & mask:
        mask <<= 1
    parent = vrank - mask if vrank else None
    children = []
    m = 1
    while m < mask and vrank + m < p:
        children.append(vrank + m)
        m <<= 1
    return parent, children


def subtree(vrank: int, p: int) -> int:
    """How many vranks the subtree of ``vrank`` holds (``vrank`` .. ``vrank + subtree - 1``)."""
    if vrank == 0:
        return p
    return min(vrank & -vrank, p - vrank)


def _topology(comm: MPI.Comm, root: int) -> tuple[int | None, list[int]]:
    p = comm.size
    parent, children = tree((comm.rank - root) % p, p)
    real = [(c + root) % p for c in children]
    return (None if parent is None else (parent + root) % p), real


def reduce(acc: np.ndarray, op: Op, root: int, comm: MPI.Comm, segment_bytes: int,
           guard: Guard | None) -> None:
    """Reduce ``acc`` over ``comm`` into ``acc`` on ``root``; other ranks' ``acc`` is clobbered."""
    parent, children = _topology(comm, root)
    nseg = nsegments(acc.size, acc.itemsize, segment_bytes)
    tmp = scratch("binomial.reduce", -(-acc.size // nseg), acc)
    for seg in split(0, acc.size, nseg):
        part = acc[seg]
        for child in children:  # smallest subtree first: rank order
            t = tmp[: part.size]
            recv(comm, t, child, guard)
            op.combine(part, t, part)
        if parent is not None:
            send(comm, part, parent, guard)


def bcast(buf: np.ndarray, root: int, comm: MPI.Comm, segment_bytes: int,
          guard: Guard | None) -> None:
    """Broadcast ``buf`` from ``root`` to every rank of ``comm``, in place."""
    parent, children = _topology(comm, root)
    nseg = nsegments(buf.size, buf.itemsize, segment_bytes)
    for seg in split(0, buf.size, nseg):
        part = buf[seg]
        if parent is not None:
            recv(comm, part, parent, guard)
        for child in reversed(children):  # largest subtree first
            send(comm, part, child, guard)


def gather(work: np.ndarray, voffsets: list[int], root: int, comm: MPI.Comm,
           guard: Guard | None) -> None:
    """Gather into ``work``, the range of this rank's subtree in vrank order (its own block
    first, filled by the caller): on ``root`` every block, in vrank order."""
    p = comm.size
    vrank = (comm.rank - root) % p
    parent, children = tree(vrank, p)
    base = voffsets[vrank]
    for c in children:  # each child's subtree range, smallest first
        hi = voffsets[c + subtree(c, p)]
        recv(comm, work[voffsets[c] - base:hi - base], (c + root) % p, guard)
    if parent is not None:
        send(comm, work, (parent + root) % p, guard)


def scatter(work: np.ndarray, voffsets: list[int], root: int, comm: MPI.Comm,
            guard: Guard | None) -> None:
    """Scatter from ``work`` on ``root`` (every block, in vrank order): every rank ends with the
    range of its subtree in ``work``, its own block first."""
    p = comm.size
    vrank = (comm.rank - root) % p
    parent, children = tree(vrank, p)
    base = voffsets[vrank]
    if parent is not None:
        recv(comm, work, (parent + root) % p, guard)
    for c in reversed(children):  # largest subtree first
        hi = voffsets[c + subtree(c, p)]
        send(comm, work[voffsets[c] - base:hi - base], (c + root) % p, guard)
