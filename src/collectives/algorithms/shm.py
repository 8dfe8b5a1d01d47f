"""Shared-memory allreduce: each rank reduces its 1/p block reading all p inputs in place.

On one node every message-based algorithm moves data through MPI's shared-memory transport,
which copies each message twice (sender into a shared cell, cell into the receiver). Here the
ranks of the node share an MPI-3 window (``MPI.Win.Allocate_shared`` on the communicator, whose
ranks must all share a node) and read each other's data directly, as NCCL and MPICH's
release/gather collectives do:

1. The vector of ``n`` elements is cut into ``p`` blocks; rank ``b`` owns block ``b``. Each block
   is cut into segments so that one *round* (segment ``t`` of every block) fits a slot of
   ``Options.shm_segment_bytes``; a few slots per rank are reused round after round, so the
   window stays small for any message size.
2. Stage: each rank copies its round-``t`` segments of the other ranks' blocks into its input
   slot (skipped for an input that already lives in shared memory, ``collectives.empty``).
3. Reduce: rank ``b`` combines segment ``t`` of block ``b`` from all ``p`` inputs, in rank
   order, in one pass over memory (a Numba kernel per op and dtype, no temporaries), and writes
   it to its own result, to its output slot, and straight into every result that lives in shared
   memory.
4. Copy out: each rank copies the other blocks' segment ``t`` from their owners' output slots.

Long vectors (from 4 MiB under MPICH and 512 KiB under other MPI libraries, or 16 MiB when ranks
share cores) in private buffers skip steps 2 and 4 where the
kernel allows it: the reducer reads the other ranks' segments of its block straight from their
memory with ``process_vm_readv`` (cross-memory attach, as MPICH's and Open MPI's single-copy
transports do), and each rank then reads the other blocks straight from their reducers'
outputs; every rank writes only its own memory (``_runtime/shmem/team.py``).

Ranks hand rounds to each other through counters in the window (``_runtime/shmem/team.py``; the
protocol and why it is correct under MPI's memory model: docs/shm-protocol.md), never through MPI
messages or barriers, and the three steps of consecutive rounds overlap. Vectors of up to
``REPLICATE_BYTES`` skip the blocks: every rank stages all of its vector and reduces all of it from
every input itself (the same operands in the same order through the same kernel, so the same bits),
one hand-off per round instead of two, which is what latency-bound sizes need.

Cost: no message latency, only a few cache-line hand-offs per round (``nseg`` rounds). Memory
traffic per rank, with ``beta`` the time to copy a byte and ``gamma`` to combine one: staging
``n (p-1)/p beta``, reducing ``n (p-1)/p gamma`` (it reads ``n`` bytes and writes ``2 n/p``),
copying out ``n (p-1)/p beta``: ``2 n (p-1)/p beta + n (p-1)/p gamma``, ring's bandwidth term with each
byte copied once instead of through MPI's two copies. By cross-memory attach the slots' writes
and other cores' reads of them are gone: ``n (p-1)/p`` bytes read from other processes, each
result byte written once, plus ``2 (p-1)`` system calls per round. With ``collectives.empty`` buffers for
input and output there is nothing to stage or copy out: ``n (p-1)/p gamma`` plus writing the
result into every rank's output (``n`` bytes per rank). Each block is reduced once, by its
owner, and then only copied, so results are bitwise identical on every rank.

A process's first call in a dtype needs the kernel's machine code: from Numba's cache, or compiled
(about ten seconds; ``python -m collectives warmup`` fills the cache ahead). A call waits for it,
and rank 0 says so in one line when it takes long. With ``COLLECTIVES_JIT_BACKGROUND=1`` (read at
import), "auto" runs :func:`allreduce_or_messages` without waiting: while the kernel compiles, in
a background thread, the calls run by messages instead:
an allgather, then every rank combines the p inputs in rank order with NumPy, the same operations
in the same order as the kernel, so the same bits (``_by_messages``). Every such call first agrees
on every rank whether all have the kernel (a 5-word allreduce); from the call where all have it,
the team's ``warm`` set holds the dtype, and a call costs one identity test more (its dtype is
the team's ``last_warm``) or a set lookup (another dtype). It is off by default because one
failure is not yet safe there: a rank that fails inside the call whose agreement switches to the
kernel (after contributing to it) keeps asking while the others no longer do, and a program that
catches that error and calls again hangs (docs/benchmarks/first-call.md). With
the default abort-on-error hook (``_runtime/crash.py``) or ``Options.timeout`` the job still ends.

Only for communicators whose ranks share one node (``Split_type(COMM_TYPE_SHARED)``, or one
emulated node of ``Options.node_size``): otherwise every rank raises the same ``ValueError``,
naming the ranks off rank 0's node. The window is created at the first call on a communicator and
kept in its private context (freed with it), so later calls, and persistent plans, reuse it.
"""

from __future__ import annotations

import os

import numpy as np

from .._runtime.context import Context
from .._runtime.guard import everywhere
from .._runtime.shmem import layout
from .._runtime.shmem.buffers import registry
from .._runtime.nodes import not_on_one_node
from .._runtime.shmem.team import Team
from ..blocks import native as native_blocks
from ..ops import Op, elementwise, get_op
from ..options import Options
from .flat import FLAT

__all__ = ["allreduce", "allreduce_or_messages", "on_one_node", "team", "REPLICATE_BYTES"]

#: Up to this many bytes every rank reduces the whole vector itself from every input (one
#: hand-off per round instead of two; the same operands in the same order, so the same bits).
REPLICATE_BYTES = 64 << 10
#: Bytes per rank that one allgather of ``_by_messages`` moves (its memory: p times this).
BY_MESSAGES_BYTES = 1 << 20


def _why_not(ctx: Context, opts: Options) -> str | None:
    return ctx.cached(("shm-node", opts.node_size),
                      lambda comm: not_on_one_node(comm, opts.node_size))


def on_one_node(ctx: Context, opts: Options) -> bool:
    """Whether every rank of ``ctx.comm`` shares one (emulated) node (collective at first use)."""
    return _why_not(ctx, opts) is None


def team(ctx: Context, opts: Options) -> Team:
    """The communicator's shm team for these options, created (collectively) on first use.

    Raises
    ------
    ValueError
        Some ranks are not on rank 0's node (every rank raises it, with the same message).
    """
    key = ("shm", opts.node_size, opts.shm_segment_bytes)
    found = ctx.cache.get(key)  # the per-call path: one lookup, no closure
    if found is None:
        found = ctx.cached(key, lambda comm: _make_team(ctx, opts))
    if type(found) is str:  # the verdict of every rank together: each raises it, no notice
        raise everywhere(ValueError, found)
    return found


def _make_team(ctx: Context, opts: Options) -> Team | str:
    """The team, or the reason there is none (cached like a team, raised at every call)."""
    why = _why_not(ctx, opts)
    return why if why is not None else Team(ctx.comm, opts.shm_segment_bytes, registry(ctx))


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options,
              wait: bool = True) -> None:
    """``algorithm="shm"``; ``wait=False`` (what "auto" runs: :func:`allreduce_or_messages`): by
    messages while the kernel compiles (see the module docstring)."""
    shm = team(ctx, opts)
    if not elementwise(op):  # bfloat16 words, a codec's sum: the window's kernels cannot
        FLAT["ring"](src, buf, op, ctx, opts)
        return
    opcode = layout.OPCODES[op.name]
    if type(buf) is not np.ndarray:  # CuPy: the window is host memory, so reduce a host copy
        host = src.get()
        allreduce(host, host, op, ctx, opts, wait)
        buf.set(host)
    elif not wait and buf.dtype is not shm.last_warm and _not_yet(shm, src, buf, ctx, opts):
        _by_messages(src, buf, op, ctx, opts)
    elif buf.nbytes <= REPLICATE_BYTES:
        shm.run(src, buf, opcode, layout.REPLICATED, 1, ctx.active)
    else:
        shm.run(src, buf, opcode, layout.FUSED, shm.size, ctx.active)


#: ``COLLECTIVES_JIT_BACKGROUND=1``: "auto" does not wait for the kernel (module docstring)
BACKGROUND = os.environ.get("COLLECTIVES_JIT_BACKGROUND", "0").strip() == "1"


def allreduce_or_messages(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context,
                          opts: Options) -> None:
    """What "auto" runs for "shm": with :data:`BACKGROUND`, by messages while the kernel
    compiles, not waiting for it; else :func:`allreduce` itself."""
    allreduce(src, buf, op, ctx, opts, not BACKGROUND)


def _not_yet(shm: Team, src: np.ndarray, buf: np.ndarray, ctx: Context, opts: Options) -> bool:
    """Whether this call runs by messages (the kernel compiles on some rank); else the dtype is
    the team's ``last_warm`` from now on (the per-call check: one identity test)."""
    code = buf.dtype.num
    if code not in shm.warm:
        if _compiling(shm, src, buf, ctx, opts):
            return True
        if code not in shm.warm:  # the ranks' calls differ: the kernel's call says so
            return False
    shm.last_warm = buf.dtype
    return False


def _compiling(shm: Team, src: np.ndarray, buf: np.ndarray, ctx: Context, opts: Options) -> bool:
    """Whether some rank still compiles the kernel for ``buf``'s dtype (the same answer on every
    rank). Also False when the ranks' counts or dtypes differ: the kernel's call then says so."""
    mine = int(shm.ready(src, buf))
    n, code = buf.size, buf.dtype.num
    words = np.array([mine, n, -n, code, -code], np.int64)
    FLAT["native"](words, words, get_op("min", words.dtype), ctx, opts)
    if words[1] != -words[2] or words[3] != -words[4]:
        return False
    if words[0]:
        shm.warm.add(code)
    return not words[0]


def _by_messages(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    """The kernel's result without it: per chunk of ``BY_MESSAGES_BYTES``, an allgather of the
    p inputs, then ``((x_0 op x_1) op x_2) ...`` in rank order (float16 computed in float32 and
    rounded after each operation by NumPy, as the kernel does)."""
    p = ctx.comm.size
    step = max(1, BY_MESSAGES_BYTES // buf.itemsize)
    for lo in range(0, buf.size, step):
        c = min(step, buf.size - lo)
        rows = np.empty((p, c), buf.dtype)
        native_blocks.allgather(src[lo:lo + c], rows.reshape(-1), [q * c for q in range(p + 1)],
                                ctx, opts)
        part = buf[lo:lo + c]
        np.copyto(part, rows[0])
        for q in range(1, p):
            op.combine(part, rows[q], part)
