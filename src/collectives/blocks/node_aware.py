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

Equal blocks (no ``counts=``) take a shorter path: what the leader does is then a fixed
permutation of ``b``-byte rows, made once per layout (:class:`Plan`), so a call is one indexed
copy to pack the messages to the other nodes and two to make the results, in buffers kept for
the block size; the leader posts its receives from the other leaders before its node's inputs
arrive, and the other ranks post their input and their result's receive in one round. The v
form learns the counts at every call and keeps the general path.

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
from .._runtime.p2p import cancel, complete, exchange, post
from .._runtime.workspace import scratch
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
    plan: "Plan | None" = None  # the leader's row permutations for equal blocks (made once)

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
    lay = Layout(node, leaders, members, home, local)
    if node.rank == 0 and not lay.flat:
        lay.plan = _plan(lay, int(leaders.rank))
    return lay


@dataclass
class Plan:
    """The leader's work for equal blocks of ``b`` bytes, as row indices into arrays of
    ``b``-byte rows (the same for every ``b`` and dtype). The leader's work buffer ``W`` holds
    the node's inputs (``k x p`` rows: local rank ``q``'s block for rank ``j`` at ``q p + j``),
    then the messages from the other nodes (``others``, in order; node ``m``'s has ``k x k_m``
    rows: its rank of local place ``a``'s block for this node's local rank ``q`` at
    ``q k_m + a``)."""

    k: int                 # ranks of this node
    p: int                 # ranks of the communicator
    others: list[int]      # the other nodes, in order
    sizes: list[int]       # rows of each one's message (each way: k x k_m)
    pack: np.ndarray       # the rows of W that make the messages to ``others``, one after another
    unpack: np.ndarray     # the rows of W that make the results: local rank q's at q p .. q p + p
    views: "_Views | None" = None  # the buffers of the last call's block size


def _plan(lay: Layout, mine: int) -> Plan:
    ranks = lay.members[mine]
    k, p = len(ranks), len(lay.home)
    others = [m for m in range(len(lay.members)) if m != mine]
    # to node m: for its rank j (local order), for this node's rank q, the block q -> j
    pack = [q * p + j for m in others for j in lay.members[m] for q in range(k)]
    base = {}
    at = k * p
    for m in others:
        base[m] = at
        at += k * len(lay.members[m])
    unpack = [q * p + ranks[t] if lay.home[i] == mine
              else base[lay.home[i]] + t * len(lay.members[lay.home[i]]) + lay.local[i]
              for t in range(k) for i in range(p) for q in [lay.local[i]]]
    return Plan(k, p, others, [k * len(lay.members[m]) for m in others],
                np.array(pack, dtype=np.intp), np.array(unpack, dtype=np.intp))


def alltoall(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
             recvoffsets: Sequence[int] | None, ctx: Context, opts: Options) -> None:
    lay = ctx.cached(("alltoall.node_aware", opts.node_size),
                     lambda comm: layout(comm, opts.node_size))
    if lay.flat or type(src) is not np.ndarray:
        pairwise_alltoall(src, dst, sendoffsets, recvoffsets, ctx, opts)
        return
    guard, node = ctx.active, lay.node
    k, p = node.size, ctx.comm.size
    if recvoffsets is None and _bytewise(src, dst, sendoffsets[1] - sendoffsets[0], p):
        _equal(src, dst, (sendoffsets[1] - sendoffsets[0]) * src.dtype.itemsize, lay, ctx)
        return
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


def _bytewise(src: np.ndarray, dst: np.ndarray, block: int, p: int) -> bool:
    """Whether equal blocks of ``block`` elements can be moved as rows of bytes."""
    return (block > 0 and src.flags.c_contiguous and dst.flags.c_contiguous
            and dst.size >= p * block)


def _equal(src: np.ndarray, dst: np.ndarray, b: int, lay: Layout, ctx: Context) -> None:
    """Equal blocks of ``b`` bytes: the leader's packing and unpacking are each one indexed
    copy (:class:`Plan`), its receives from the other leaders are posted before the node's
    inputs have arrived, and the other ranks send their input and receive their result in
    one round."""
    guard, node, p = ctx.active, lay.node, ctx.comm.size
    x = src.reshape(-1).view(np.uint8)
    y = dst.reshape(-1)[:p * b // dst.dtype.itemsize].view(np.uint8)
    if node.rank:  # 1. the input to the leader; 3. the result from it
        exchange(node, [(x, 0)], [(y, 0)], guard)
        return
    plan = lay.plan
    v = plan.views if plan.views is not None and plan.views.b == b else _views(plan, b, x)
    plan.views = v
    early = post(lay.leaders, [], v.arrivals, guard)  # the other leaders' messages, into W
    try:
        v.work[:p].reshape(-1)[:] = x
        complete([post(node, [], v.inputs, guard)], guard)  # 1.
        np.take(v.work, plan.pack, axis=0, out=v.packed, mode="clip")
    except BaseException:
        cancel(early)
        raise
    # 2. one message per other node (packed receiver by receiver)
    complete([early, post(lay.leaders, v.sends, [], guard)], guard)
    # 3. the results: this rank's into dst, the others' sent from one buffer
    np.take(v.work, plan.unpack[:p], axis=0, out=y.reshape(p, b), mode="clip")
    np.take(v.work, plan.unpack[p:], axis=0, out=v.results, mode="clip")
    exchange(node, v.outs, [], guard)


@dataclass
class _Views:
    """The leader's buffers for blocks of ``b`` bytes (in the workspace) and the messages'
    views of them, kept for the next call with the same ``b``."""

    b: int
    work: np.ndarray       # W as rows of b bytes
    packed: np.ndarray     # the messages to the other nodes, rows of b bytes
    results: np.ndarray    # the other local ranks' results, rows of b bytes
    inputs: list           # (receive buffer, local rank) of the node's inputs
    arrivals: list         # (receive buffer, leader) of the other nodes' messages
    sends: list            # (message, leader) to the other nodes
    outs: list             # (result, local rank) to the node's other ranks


def _views(plan: Plan, b: int, like: np.ndarray) -> _Views:
    k, p = plan.k, plan.p
    rows = k * p + sum(plan.sizes)
    work = scratch("alltoall.node_aware.work", rows * b, like).reshape(rows, b)
    packed = scratch("alltoall.node_aware.packed", len(plan.pack) * b, like)
    results = scratch("alltoall.node_aware.results", (k - 1) * p * b, like)
    inputs = work[:k * p].reshape(k, p * b)
    arrivals, sends, at = [], [], 0
    for m, n in zip(plan.others, plan.sizes):
        arrivals.append((work[k * p + at:k * p + at + n].reshape(-1), m))
        sends.append((packed[at * b:(at + n) * b], m))
        at += n
    rests = results.reshape(k - 1, p * b)
    return _Views(b, work, packed.reshape(-1, b), results.reshape(-1, b),
                  [(inputs[q], q) for q in range(1, k)], arrivals, sends,
                  [(rests[q - 1], q) for q in range(1, k)])


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
