"""Hierarchical (node-aware) allreduce: reduce-scatter in the node, allreduce across, allgather in.

Nodes are the shared-memory groups of ``Split_type(COMM_TYPE_SHARED)``, optionally cut into
emulated nodes of ``Options.node_size`` ranks. Let ``m`` be the size of the smallest node. On each
node the first ``m`` local ranks are *position holders*; a node's other ranks are *extras*.

1. Fold: each extra (local rank ``e >= m``) sends its vector to local rank ``e mod m``, which
   combines it after its own (rank order). Nodes of unequal size are handled here; Horovod and Open
   MPI's han require equal sizes, we don't.
2. Inside the node: ring reduce-scatter among the ``m`` position holders, over ``m`` blocks, so
   local rank ``j`` holds block ``j`` reduced over its node.
3. Across nodes: the ranks holding position ``j`` on every node allreduce block ``j`` with any flat
   algorithm (``Options.inter_algorithm``, ring by default).
4. Inside the node: ring allgather of the ``m`` blocks among the position holders, then each
   holder sends the full result to its extras.

Cost with N nodes of m ranks, intra-node (alpha_i, beta_i) and inter-node (alpha_e, beta_e), ring
inside and across: 2 (m-1) alpha_i + 2 n (m-1)/m beta_i + 2 (N-1) alpha_e + 2 (n/m)(N-1)/N beta_e
(+ reduction terms): only n/m bytes per rank cross the slow network, and every node's m links carry
traffic in parallel (Horovod's hierarchical allreduce; NCCL's tree/ring split is the same idea).
Results are bitwise identical everywhere: each block is finished by one flat allreduce, whose
participants agree bitwise, and then only copied.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .._arrays import copy_into
from .._context import Context
from .._p2p import partition, recv, send
from .._workspace import scratch
from ..blocks import ring
from ..ops import Op
from ..options import Options
from .flat import FLAT

__all__ = ["allreduce", "Layout", "layout", "nodes_of", "node_ids", "node_sizes"]


@dataclass
class Layout:
    """This rank's place in the two-level decomposition of a communicator."""

    node: MPI.Comm       # every rank of this rank's (emulated) node
    m: int               # size of the smallest node: the number of positions
    holders: MPI.Comm    # the node's position holders (COMM_NULL on an extra)
    cross: Context | None  # the ranks holding this position on every node (None on an extra)

    def free(self) -> None:
        for comm in (self.node, self.holders) + ((self.cross.comm,) if self.cross else ()):
            if comm != MPI.COMM_NULL:
                comm.Free()


def nodes_of(comm: MPI.Comm, node_size: int | None) -> MPI.Comm:
    """This rank's node: its shared-memory group (``Split_type(COMM_TYPE_SHARED)``), cut into
    emulated nodes of ``node_size`` ranks when given (collective; the caller frees it)."""
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    if node_size is None:
        return shared
    node = shared.Split(shared.rank // node_size, shared.rank)
    shared.Free()
    return node


def node_ids(comm: MPI.Comm, node_size: int | None = None) -> list[int]:
    """For every rank of ``comm``, the lowest rank of its node (collective; the same list on
    every rank)."""
    node = nodes_of(comm, node_size)
    lowest = node.allreduce(comm.rank, op=MPI.MIN)
    node.Free()
    return comm.allgather(lowest)


def node_sizes(comm: MPI.Comm, node_size: int | None = None) -> list[int]:
    """The size of every node of ``comm``, nodes in the order of their lowest rank (collective;
    the same list on every rank). ``[p]``: one node."""
    count = Counter(node_ids(comm, node_size))
    return [count[k] for k in sorted(count)]


def layout(comm: MPI.Comm, node_size: int | None) -> Layout:
    """Build the node, position-holder and cross-node communicators (collective)."""
    node = nodes_of(comm, node_size)
    m = comm.allreduce(node.size, op=MPI.MIN)
    local = node.rank
    holders = node.Split(0 if local < m else MPI.UNDEFINED, local)
    cross = comm.Split(local if local < m else MPI.UNDEFINED, comm.rank)
    return Layout(node, m, holders, Context(cross, dup=False) if local < m else None)


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    lay = ctx.cached(("hierarchical", opts.node_size),
                     lambda comm: layout(comm, opts.node_size))
    copy_into(src, buf)
    local, m = lay.node.rank, lay.m
    if local >= m:
        # an extra: hand our vector to our position holder, get the result back
        send(lay.node, buf, local % m)
        recv(lay.node, buf, local % m)
        return
    extras = range(local + m, lay.node.size, m)
    tmp = scratch("hierarchical", buf.size, buf)
    for e in extras:  # 1. fold in this holder's extras, in rank order
        recv(lay.node, tmp, e)
        op.combine(buf, tmp, buf)
    offsets = partition(buf.size, m)
    ring.reduce_scatter(buf, offsets, op, lay.holders, opts.segment_bytes)  # 2.
    block = buf[offsets[local]:offsets[local + 1]]
    FLAT[opts.inter_algorithm](block, block, op, lay.cross, opts)  # 3.
    ring.allgather(buf, offsets, lay.holders)  # 4.
    for e in extras:
        send(lay.node, buf, e)
