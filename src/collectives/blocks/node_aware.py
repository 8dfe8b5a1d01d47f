"""Node-aware (hierarchical) alltoall: gather in the node, one message per pair of nodes, scatter.

Nodes are the shared-memory groups of ``Split_type(COMM_TYPE_SHARED)``, optionally cut into
emulated nodes of ``Options.node_size`` ranks (as the hierarchical allreduce's); they may differ
in size. Each node's *leader* is its local rank 0. With ``C[i][j]`` the elements rank ``i`` sends
to rank ``j`` (``MPI_Alltoallv``'s counts; all equal without ``counts=``):

1. **Gather in the node.** Every rank sends its whole input to its leader (the leader learns the
   node's send and receive counts with it, in the v form).
2. **Across nodes.** For each other node ``m`` the leader packs one message: for each rank ``j``
   of ``m`` (local order), for each rank ``i`` of its own node (local order), the block
   ``i -> j``; the leaders exchange these messages all at once (one message per pair of nodes,
   where a flat alltoall sends one per pair of ranks). The node's own blocks stay in place.
3. **Scatter in the node.** The leader assembles each local rank ``j``'s result, the blocks
   ``i -> j`` in rank order of ``i``, and sends it to ``j``, which receives it straight into its
   output.

Cost with N nodes of k ranks and n bytes per rank (``p = N k``): across nodes, ``(N - 1) alpha_e``
and ``k n (N - 1)/N beta_e`` per leader, against ``(p - 1) alpha_e`` per rank for a flat
alltoall: the same bytes cross a node's link (no alltoall can send fewer than the blocks bound
for other nodes), in ``k^2`` times fewer, larger messages; inside the node, ``2 (k - 1) n``
bytes through the leader and two local copies of the node's ``k n`` bytes (pack, assemble). It
pays where the link's latency, or its per-message cost, dominates: short blocks between nodes.
On one node (or nodes of one rank each) there is nothing to save, and pairwise exchange
(``pairwise.py``) runs instead; so do device arrays.

Every block is copied, never combined: results are bitwise those of any other alltoall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from mpi4py import MPI

from .._runtime.arrays import copy_into
from .._runtime.context import Context
from .._runtime.nodes import node_comm
from .._runtime.p2p import exchange
from ..options import Options
from .handwritten import pairwise_alltoall

__all__ = ["alltoall", "Layout", "layout"]


@dataclass
class Layout:
    """A communicator's nodes, as the node-aware alltoall sees them."""

    node: MPI.Comm         # every rank of this rank's (emulated) node, in the communicator's order
    leaders: MPI.Comm      # the node leaders (COMM_NULL elsewhere); rank m leads node m
    members: list[list[int]]  # members[m]: the ranks of node m, in local order
    home: np.ndarray       # home[i]: the node of rank i
    local: np.ndarray      # local[i]: rank i's place in its node

    @property
    def flat(self) -> bool:
        """Whether there is nothing to gather: one node, or nodes of one rank each."""
        return len(self.members) in (1, len(self.home))

    def free(self) -> None:
        for comm in (self.node, self.leaders):
            if comm != MPI.COMM_NULL:
                comm.Free()


def layout(comm: MPI.Comm, node_size: int | None) -> Layout:
    """The node and leader communicators of ``comm`` and who is where (collective)."""
    node = node_comm(comm, node_size)
    leaders = comm.Split(0 if node.rank == 0 else MPI.UNDEFINED, comm.rank)
    index = node.bcast(leaders.rank if node.rank == 0 else None, root=0)
    places = comm.allgather((index, node.rank))  # collectives only (the guard's tags: p2p)
    home = np.array([m for m, _ in places], dtype=np.int64)
    local = np.array([q for _, q in places], dtype=np.int64)
    members: list[list[int]] = [[] for _ in range(int(home.max()) + 1)]
    for i in np.lexsort((local, home)):
        members[home[i]].append(int(i))
    return Layout(node, leaders, members, home, local)


def alltoall(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
             recvoffsets: Sequence[int] | None, ctx: Context, opts: Options) -> None:
    lay = ctx.cached(("alltoall.node_aware", opts.node_size),
                     lambda comm: layout(comm, opts.node_size))
    if lay.flat or type(src) is not np.ndarray:
        pairwise_alltoall(src, dst, sendoffsets, recvoffsets, ctx, opts)
        return
    guard, node = ctx.active, lay.node
    k, p = node.size, ctx.comm.size
    send = np.diff(np.asarray(sendoffsets, dtype=np.int64))
    recv = send if recvoffsets is None else np.diff(np.asarray(recvoffsets, dtype=np.int64))
    roff = np.asarray(sendoffsets if recvoffsets is None else recvoffsets, dtype=np.int64)
    mine = lay.home[ctx.comm.rank]
    if node.rank:  # 1. to the leader (with the counts in the v form); 3. the result from it
        if recvoffsets is not None:
            exchange(node, [(np.concatenate([send, recv]), 0)], [], guard)
        exchange(node, [(src, 0)], [], guard)
        exchange(node, [], [(dst[:int(roff[-1])], 0)], guard)
        return
    # the leader: C[i, j] for i or j in this node (rows: senders, columns: receivers)
    ranks = lay.members[mine]
    counts = np.zeros((p, p), dtype=np.int64)
    if recvoffsets is None:
        counts[:] = send[0]
    else:
        got = [np.empty(2 * p, dtype=np.int64) for _ in range(k - 1)]
        exchange(node, [], [(g, q + 1) for q, g in enumerate(got)], guard)
        for i, both in zip(ranks, [np.concatenate([send, recv])] + got):
            counts[i, :] = both[:p]
            counts[:, i] = both[p:]
    inputs = [src] + [np.empty(int(counts[i].sum()), src.dtype) for i in ranks[1:]]
    exchange(node, [], [(a, q + 1) for q, a in enumerate(inputs[1:])], guard)  # 1.
    starts = np.zeros((p, p + 1), dtype=np.int64)  # where block i -> j starts in i's input
    np.cumsum(counts, axis=1, out=starts[:, 1:])
    # 2. one message per other node: for j of node m, for i of this node, the block i -> j
    packed = {m: _pack(inputs, ranks, members, starts, counts)
              for m, members in enumerate(lay.members)}
    others = [m for m in range(len(lay.members)) if m != mine]
    arrived = {m: np.empty(int(counts[np.ix_(lay.members[m], ranks)].sum()), src.dtype)
               for m in others}
    exchange(lay.leaders, [(packed[m], m) for m in others], [(arrived[m], m) for m in others],
             guard)
    arrived[mine] = packed[mine]
    # 3. each local rank's blocks i -> j in rank order of i, from the message of i's node
    where = {m: _offsets(counts, lay.members[m], ranks) for m in arrived}
    results = [dst[:int(roff[-1])]] + [np.empty(int(counts[:, j].sum()), src.dtype)
                                       for j in ranks[1:]]
    for q, j in enumerate(ranks):
        at = 0
        for i in range(p):
            m, n = lay.home[i], int(counts[i, j])
            lo = where[m][lay.local[i], q]
            copy_into(arrived[m][lo:lo + n], results[q][at:at + n])
            at += n
    exchange(node, [(r, q + 1) for q, r in enumerate(results[1:])], [], guard)


def _pack(inputs: list[np.ndarray], ranks: list[int], members: list[int], starts: np.ndarray,
          counts: np.ndarray) -> np.ndarray:
    """For each rank j of ``members``, for each rank i of ``ranks`` (this node, whose inputs
    are ``inputs``), the block i -> j, one after the other."""
    parts = [inputs[q][starts[i, j]:starts[i, j] + counts[i, j]]
             for j in members for q, i in enumerate(ranks)]
    return np.concatenate(parts) if parts else inputs[0][:0].copy()


def _offsets(counts: np.ndarray, senders: list[int], receivers: list[int]) -> np.ndarray:
    """``[a, b]``: where block ``senders[a] -> receivers[b]`` starts in the message that packs
    them receiver by receiver (:func:`_pack`'s order)."""
    blocks = counts[np.ix_(senders, receivers)].T.reshape(-1)  # receiver-major, as packed
    starts = np.concatenate([[0], np.cumsum(blocks)[:-1]])
    return starts.reshape(len(receivers), len(senders)).T
