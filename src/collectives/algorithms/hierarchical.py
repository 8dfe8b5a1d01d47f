"""Hierarchical (node-aware) allreduce: reduce-scatter in the node, allreduce across, allgather in.

Nodes are the shared-memory groups of ``Split_type(COMM_TYPE_SHARED)`` (the real nodes, by
default), optionally cut into emulated nodes of ``Options.node_size`` ranks. Let ``m`` be the size
of the smallest node. On each node the first ``m`` local ranks are *position holders*; a node's
other ranks are *extras*. Nodes of unequal size are allowed (Horovod and Open MPI's han require
equal sizes; we don't).

1. Inside the node, through shared memory (the ``shm`` algorithm's window and protocol,
   ``_runtime/shmem/team.py``, in its reduce-scatter mode): the vector is cut into ``m`` blocks, and
   holder ``j`` reduces block ``j`` reading every rank's input of the node, extras included, in
   local rank order, into its own result.
2. Across nodes: the ranks holding position ``j`` on every node allreduce block ``j`` with any flat
   algorithm (``Options.inter_algorithm``, ring by default).
3. Inside the node, through shared memory again (allgather mode): every rank of the node copies
   block ``j`` from holder ``j``.

CuPy arrays, and ops the shared-memory kernels do not compute (``ops.elementwise``), take the
same steps with messages instead: the extras send their vectors to a holder, which combines them,
a ring reduce-scatter and ring allgather run among the holders, and the holders send the result
back to their extras.

Cost with N nodes of m ranks, memory copy ``beta_s`` and inter-node (alpha_e, beta_e), ring
across: ``2 n (m-1)/m beta_s`` (plus ``n (m-1)/m gamma``) inside the node, with no message latency,
and ``2 (N-1) alpha_e + 2 (n/m)(N-1)/N beta_e`` across it: only n/m bytes per rank cross the slow
network, and every node's m links carry traffic in parallel (Horovod's hierarchical allreduce;
NCCL's tree/ring split is the same idea). Results are bitwise identical everywhere: each block is
reduced once in its node and finished by one flat allreduce, whose participants agree bitwise,
and then only copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .._runtime.arrays import copy_into
from .._runtime.context import Context
from .._runtime.p2p import recv, send
from .._runtime.ranks import partition
from .._runtime.release import park
from .._runtime.shmem import layout as shm_layout
from .._runtime.shmem import team as shm_team
from .._runtime.shmem.buffers import registry
from .._runtime.nodes import node_comm
from .._runtime.shmem.team import Team
from .._runtime.workspace import scratch
from ..blocks import ring
from ..ops import Op, elementwise
from ..options import Options
from .flat import FLAT

__all__ = ["allreduce", "prepare", "Layout", "layout"]


@dataclass
class Layout:
    """This rank's place in the two-level decomposition of a communicator."""

    node: MPI.Comm       # every rank of this rank's (emulated) node
    m: int               # size of the smallest node: the number of positions
    holders: MPI.Comm    # the node's position holders (COMM_NULL on an extra)
    cross: Context | None  # the ranks holding this position on every node (None on an extra)
    team: Team | None = None  # the node's shared-memory team (None for a node of one rank)
    owner: Context | None = None  # the context whose calls run across (their guard)

    def free(self) -> None:
        if self.team is not None:
            self.team.free()
        # MPI's own collectives across nodes run under the owner's guard: where it retired
        # native they may have gone different ways on different ranks, and the cross-node
        # communicator and its control communicator (native's signature check) are parked,
        # never freed before exit (_runtime/release.py, step 4)
        guard = None if self.owner is None else self.owner._guard
        diverged = guard is not None and guard.retired
        if self.cross is not None:
            for comm in (self.cross.control_comm, self.cross.comm):
                if diverged:
                    park(comm)
                else:
                    comm.Free()
        for comm in (self.node, self.holders):
            if comm != MPI.COMM_NULL:
                comm.Free()


def layout(comm: MPI.Comm, node_size: int | None, ctx: Context | None = None,
           shm_segment_bytes: int | None = None, touch: bool = False) -> Layout:
    """Build the node, position-holder and cross-node communicators (collective), and the
    node's shared-memory team when ``ctx`` (whose shared arrays it may use in place) is given
    (``touch``: its pages written once, as :class:`Team` says)."""
    node = node_comm(comm, node_size)
    m = min(comm.allgather(node.size))  # collectives, never point-to-point (_guard.Guard)
    local = node.rank
    holders = node.Split(0 if local < m else MPI.UNDEFINED, local)
    cross = comm.Split(local if local < m else MPI.UNDEFINED, comm.rank)
    team = None
    if ctx is not None:
        buffers = registry(ctx)  # collective over comm: on every rank, before the teams
        if node.size > 1:
            team = Team(node, shm_segment_bytes, buffers, touch)
    # the cross-node context checks a native operation's signature on a control communicator
    # of its own (_runtime/agree.py): nodes whose ranks pass other counts raise on every rank
    cross_ctx = Context(cross, dup=False, control=cross.Dup()) if local < m else None
    return Layout(node, m, holders, cross_ctx, team, ctx)


def prepare(ctx: Context, opts: Options) -> None:
    """Make the communicator's layout ahead of its first call, the team's pages written once
    (``collectives.preload(comm=...)``), if it has none yet (collective)."""
    key = ("hierarchical", opts.node_size, opts.shm_segment_bytes)
    if key not in ctx.cache:
        ctx.cached(key, lambda comm: layout(comm, opts.node_size, ctx, opts.shm_segment_bytes,
                                            touch=True))


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    lay = ctx.cached(("hierarchical", opts.node_size, opts.shm_segment_bytes),  # as prepare's
                     lambda comm: layout(comm, opts.node_size, ctx, opts.shm_segment_bytes))
    if type(buf) is not np.ndarray or not elementwise(op):  # device arrays; bfloat16 words
        _by_messages(src, buf, op, lay, opts, ctx)  # and codecs' sums, which the window
        return                                       # cannot add
    local, m = lay.node.rank, lay.m
    opcode = shm_layout.OPCODES[op.name]
    if lay.team is None:
        copy_into(src, buf)
    else:  # 1. holder j: block j reduced over the node
        lay.team.run(src, buf, opcode, shm_layout.REDUCE_SCATTER, m, ctx.active,
                     not shm_team.BACKGROUND)
    if local < m and lay.cross.comm.size > 1:  # 2. block j across nodes
        offsets = partition(buf.size, m)
        _across(buf[offsets[local]:offsets[local + 1]], op, lay.cross, opts, ctx)
    if lay.team is not None:  # 3. every block from its holder
        lay.team.run(buf, buf, opcode, shm_layout.ALLGATHER, m, ctx.active,
                     not shm_team.BACKGROUND)


def _across(block: np.ndarray, op: Op, cross: Context, opts: Options, ctx: Context) -> None:
    """Allreduce ``block`` among the ranks holding this position on every node, as part of the
    call running on ``ctx`` (its guard: the same tag, notices and deadline)."""
    cross.active = ctx.active
    try:
        FLAT[opts.inter_algorithm](block, block, op, cross, opts)
    finally:
        cross.active = None


def _by_messages(src: np.ndarray, buf: np.ndarray, op: Op, lay: Layout, opts: Options,
                 ctx: Context) -> None:
    """The same steps with messages (device arrays): fold the extras in, ring inside."""
    guard = ctx.active
    copy_into(src, buf)
    local, m = lay.node.rank, lay.m
    if local >= m:
        # an extra: hand our vector to our position holder, get the result back
        send(lay.node, buf, local % m, guard)
        recv(lay.node, buf, local % m, guard)
        return
    extras = range(local + m, lay.node.size, m)
    tmp = scratch("hierarchical", buf.size, buf)
    for e in extras:  # 1. fold in this holder's extras, in rank order
        recv(lay.node, tmp, e, guard)
        op.combine(buf, tmp, buf)
    offsets = partition(buf.size, m)
    ring.reduce_scatter(buf, offsets, op, lay.holders, opts.segment_bytes, guard)  # 2.
    _across(buf[offsets[local]:offsets[local + 1]], op, lay.cross, opts, ctx)  # 3.
    ring.allgather(buf, offsets, lay.holders, guard)  # 4.
    for e in extras:
        send(lay.node, buf, e, guard)
