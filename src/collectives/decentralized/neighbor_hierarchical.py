"""Hierarchical gossip: average inside each node through shared memory, gossip between nodes.

``neighbor_allreduce(x, topology, hierarchical=True)`` computes what the flat round computes on
a topology whose vertices are nodes (:func:`collectives.topology.hierarchical_for`), but sends
each node's data across the network once per neighbor node instead of once per pair of ranks.
Such a topology gives every rank ``i`` of node ``a`` the same row, and within that row the same
weight ``V_ab / s_b`` to every rank of node ``b`` (``s_b``: node ``b``'s rank count); so

    ``sum_j W_ij x_j = sum_b V_ab xbar_b``,  ``xbar_b`` the mean of node ``b``'s ranks,

with the *node matrix* ``V_ab = sum_{j in b} W_ij`` (:func:`node_matrix`, which also checks
that the topology has this form for the communicator's nodes). The round then takes three steps,
the same decomposition as the hierarchical allreduce (``algorithms/hierarchical.py``), whose
layout (node, position-holder and cross-node communicators, the node's shared-memory team) it
shares. Let ``m`` be the size of the smallest node; rank ``j < m`` of each node holds *position*
``j`` and block ``j`` of the ``m`` near-equal blocks of the vector.

1. Inside the node, through shared memory (the ``shm`` team in reduce-scatter mode): holder
   ``j`` sums block ``j`` over every rank of the node, extras included, in local rank order, and
   divides by ``s_a``: block ``j`` of the node mean ``xbar_a``.
2. Across nodes: the holders of position ``j`` (one per node, the cross-node communicator) run
   one gossip round of block ``j`` over the node graph: holder ``j`` of node ``a`` sends its
   block to holder ``j`` of every node ``b`` with ``V_ba != 0``, receives from every node ``b``
   with ``V_ab != 0``, and combines ``V_aa xbar_a + sum_b V_ab xbar_b`` in ascending node order.
   Every rank of the node's first ``m`` shares the traffic; nodes' extras only read and write
   shared memory.
3. Inside the node, through shared memory again (allgather mode): every rank copies block ``j``
   from holder ``j``. Every rank of a node ends with the same bits.

Cost with ``N`` nodes of ``m`` ranks, ``d`` neighbor nodes and ``n`` bytes: ``2 n (m-1)/m beta_s``
plus ``n (m-1)/m gamma`` inside the node (no message latency), and ``alpha_e + d (n/m) beta_e``
across it, against ``alpha_e + d_r n beta_e`` of the flat round where a rank has ``d_r`` in-
neighbors: ``d_r = (d + 1) s - 1`` ranks on the hierarchical topology with nodes of ``s`` ranks.

What it accepts (checked before any message; every rank raises the same error): float32 and
float64 host arrays (the shared-memory kernels' sums); the topology's own weights (no
``self_weight``/``weights``: a rank's row is its node's); the ``"p2p"`` backend; a topology of
the node form above for the communicator's nodes (the shared-memory nodes, or emulated nodes of
``Options.node_size``). The nodes are found collectively, with MPI collectives, at the first
round on a communicator, after a guarded exchange of tokens (so a rank that failed its own
checks makes the others raise instead of waiting), and kept in its context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .._runtime import p2p
from .._runtime.arrays import copy_into
from .._runtime.ranks import partition
from .._runtime.shmem import layout as shm_layout
from .._runtime.shmem import team as shm_team
from .._runtime.workspace import scratch
from ..algorithms.hierarchical import Layout, layout
from ..options import Options
from .topology import Topology
from .._runtime.context import Context

__all__ = ["node_matrix", "Nodes", "HierarchicalRound", "DTYPES"]

#: the dtypes a hierarchical round takes (the node sum runs in the shared-memory kernels)
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_TOL = 1e-12  # a node's rows and a node block's weights must agree within this
_SUM = shm_layout.OPCODES["sum"]


def node_matrix(topology: Topology, node_ids: Sequence[int], step: int | None = None
                ) -> np.ndarray:
    """The node matrix ``V`` of ``topology`` at ``step`` over the nodes of ``node_ids``.

    ``node_ids[r]`` labels rank ``r``'s node; nodes are numbered in the order of their lowest
    rank. ``V[a, b] = sum_{j in b} W[i, j]`` for any rank ``i`` of node ``a``. Raises ValueError
    unless every rank of a node has the same row of ``W`` and gives the same weight to every
    rank of each node (the form :func:`collectives.topology.hierarchical` builds).
    """
    w = topology.weights(step)
    ids = list(node_ids)
    if len(ids) != topology.size:
        raise ValueError(f"{topology.name} is for {topology.size} ranks, the nodes hold {len(ids)}")
    labels = list(dict.fromkeys(ids))
    node = np.array([labels.index(v) for v in ids])
    members = [np.flatnonzero(node == a) for a in range(len(labels))]
    v = np.empty((len(labels), len(labels)))
    for a, ranks in enumerate(members):
        row = w[ranks[0]]
        differ = [int(i) for i in ranks[1:] if np.abs(w[i] - row).max() > _TOL]
        if differ:
            raise ValueError(
                f"hierarchical=True: {topology.name} gives ranks {int(ranks[0])} and {differ[0]} "
                f"(one node) different rows of W; a hierarchical round needs the same row on "
                f"every rank of a node (use collectives.topology.hierarchical_for(comm, ...) "
                f"with the same node_size)")
        for b, cols in enumerate(members):
            block = row[cols]
            if np.abs(block - block[0]).max() > _TOL:
                raise ValueError(
                    f"hierarchical=True: rank {int(ranks[0])} of {topology.name} gives the ranks "
                    f"of one node ({', '.join(map(str, cols[:8].tolist()))}) different weights; "
                    f"a hierarchical round needs one weight per node (use "
                    f"collectives.topology.hierarchical_for(comm, ...) with the same node_size)")
            v[a, b] = float(block.sum())
    return v


@dataclass
class Nodes:
    """This rank's place among the nodes (collective to make; cached in the context)."""

    layout: Layout          # the hierarchical allreduce's communicators and shared-memory team
    ids: list[int]          # every rank's node label (its node's lowest rank)
    index: int              # this rank's node, in the order of the nodes' lowest ranks
    size: int               # ranks on this rank's node
    cross_rank: list[int] | None  # node index -> rank in the cross-node communicator (holders)

    def free(self) -> None:  # the layout is the hierarchical allreduce's cache entry
        pass


def _nodes(ctx: Context, opts: Options) -> Nodes:
    """This rank's :class:`Nodes` on ``ctx``, made at the first use (collective): first a guarded
    token exchange with every rank (a rank that failed its checks before makes the others raise
    here, not wait in an MPI collective), then the layout and two allgathers."""
    name = ("neighbor_hierarchical", opts.node_size, opts.shm_segment_bytes)
    if name in ctx.cache:
        return ctx.cache[name]
    comm = ctx.comm
    if ctx.active is not None:
        others = [r for r in range(comm.size) if r != comm.rank]
        token, got = np.zeros(1, np.uint8), np.empty(len(others), np.uint8)
        p2p.exchange(comm, [(token, r) for r in others],
                     [(got[k:k + 1], r) for k, r in enumerate(others)], ctx.active)

    def make(c: MPI.Comm) -> Nodes:
        lay = ctx.cached(("hierarchical", opts.node_size, opts.shm_segment_bytes),
                         lambda cc: layout(cc, opts.node_size, ctx, opts.shm_segment_bytes))
        lowest = lay.node.bcast(c.rank, root=0)  # node_comm keeps comm's order
        ids = c.allgather(lowest)
        index = sorted(set(ids)).index(lowest)
        cross = lay.cross.comm.allgather(index) if lay.cross is not None else None
        where = None if cross is None else {a: k for k, a in enumerate(cross)}
        return Nodes(lay, ids, index, lay.node.size,
                     None if where is None else [where[a] for a in range(len(where))])

    return ctx.cached(name, make)


class HierarchicalRound:
    """One hierarchical gossip round of ``topology`` at step index ``t`` (module docstring);
    :meth:`run` fills ``dst`` from ``src`` (flat float32/float64 host arrays)."""

    __slots__ = ("topology", "t", "opts", "_v")

    def __init__(self, topology: Topology, t: int, opts: Options) -> None:
        self.topology, self.t, self.opts = topology, t, opts
        self._v: tuple[tuple[int, ...], np.ndarray] | None = None  # (node ids, V), checked once

    def run(self, src: np.ndarray, dst: np.ndarray, ctx: Context) -> None:
        nodes = _nodes(ctx, self.opts)
        ids = tuple(nodes.ids)
        if self._v is None or self._v[0] != ids:  # the same error on every rank
            self._v = (ids, node_matrix(self.topology, ids, self.t))
        v = self._v[1]
        lay, a = nodes.layout, nodes.index
        local, m = lay.node.rank, lay.m
        guard = ctx.active
        if lay.team is None:
            copy_into(src, dst)
        else:  # 1. holder j: block j summed over the node
            lay.team.run(src, dst, _SUM, shm_layout.REDUCE_SCATTER, m, guard,
                         not shm_team.BACKGROUND)
        if local < m:
            offsets = partition(dst.size, m)
            block = dst[offsets[local]:offsets[local + 1]]
            if nodes.size > 1:
                np.divide(block, nodes.size, out=block)  # the node mean
            if block.size and len(nodes.cross_rank) > 1:  # 2. block j across nodes
                _gossip(block, v, a, lay.cross.comm, nodes.cross_rank, guard)
        if lay.team is not None:  # 3. every block from its holder
            lay.team.run(dst, dst, _SUM, shm_layout.ALLGATHER, m, guard,
                         not shm_team.BACKGROUND)


def _gossip(block: np.ndarray, v: np.ndarray, a: int, cross: MPI.Comm, rank_of: list[int],
            guard: Any) -> None:
    """One neighbor round of ``block`` over the node matrix ``v`` among the holders of one
    position (one per node): ``block <- v[a, a] block + sum_b v[a, b] block_b``."""
    sources = [b for b in range(len(rank_of)) if b != a and v[a, b] != 0]
    dests = [b for b in range(len(rank_of)) if b != a and v[b, a] != 0]
    n = block.size
    recv = scratch("neighbor.hierarchical", len(sources) * n, block).reshape(len(sources), n)
    p2p.exchange(cross, [(block, rank_of[b]) for b in dests],
                 [(recv[k], rank_of[b]) for k, b in enumerate(sources)], guard)
    np.multiply(block, v[a, a], out=block)
    for k, b in enumerate(sources):  # ascending node: a fixed order
        np.multiply(recv[k], v[a, b], out=recv[k])
        np.add(block, recv[k], out=block)
