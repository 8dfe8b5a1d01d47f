"""Binomial-tree reduce and broadcast, pipelined in segments.

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
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._runtime.guard import Guard
from .._runtime.p2p import recv, send
from .._runtime.ranks import nsegments, split
from .._runtime.workspace import scratch
from ..ops import Op

__all__ = ["tree", "reduce", "bcast"]


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
