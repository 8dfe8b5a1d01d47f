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
A threshold ``collectives-tune`` measured on this machine (the tuning file's ``shm_cma_bytes``)
replaces the built-in one, ``Options.shm_cma_bytes`` either (0: every size; one above any call:
never).

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
(seconds; ``python -m collectives warmup`` fills the cache ahead). "auto" does not wait
for it (:func:`allreduce_without_waiting`): while a background thread compiles it, this rank runs
its part of each call on the *interpreted* round driver (``_runtime/shmem/kernels/interpreted.py``:
the kernels' own Python code, run by the interpreter with NumPy doing the arithmetic), which
follows the same protocol in the same window and gives the same bits, so no rank needs to know
which driver another one runs, and a failure is handled as on the kernels. From the call where
its kernel is ready a rank runs the kernel (a call costs one identity test more).
``algorithm="shm"`` named outright, and ``COLLECTIVES_JIT_BACKGROUND=0`` (read at import), wait
for the compile instead; rank 0 says so in one line when it takes long.

Only for communicators whose ranks share one node (``Split_type(COMM_TYPE_SHARED)``, or one
emulated node of ``Options.node_size``): otherwise every rank raises the same ``ValueError``,
naming the ranks off rank 0's node. The window is created at the first call on a communicator and
kept in its private context (freed with it), so later calls, and persistent plans, reuse it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._runtime.context import Context
from .._runtime.guard import everywhere
from .._runtime.shmem import layout
from .._runtime.shmem.buffers import registry
from .._runtime.nodes import not_on_one_node
from .._runtime.shmem import team as shm_team
from .._runtime.shmem.team import Team
from ..observe import OBSERVERS as _OBSERVED
from ..ops import Op, elementwise
from ..options import Options
from .flat import FLAT

__all__ = ["allreduce", "allreduce_without_waiting", "lane", "Lane", "on_one_node", "prepare",
           "team", "team_key", "tuned_cma_bytes", "REPLICATE_BYTES"]

#: Up to this many bytes every rank reduces the whole vector itself from every input (one
#: hand-off per round instead of two; the same operands in the same order, so the same bits).
REPLICATE_BYTES = 64 << 10


def _why_not(ctx: Context, opts: Options) -> str | None:
    return ctx.cached(("shm-node", opts.node_size),
                      lambda comm: not_on_one_node(comm, opts.node_size))


def on_one_node(ctx: Context, opts: Options) -> bool:
    """Whether every rank of ``ctx.comm`` shares one (emulated) node (collective at first use)."""
    return _why_not(ctx, opts) is None


def team_key(opts: Options) -> tuple:
    """The key of the communicator's team for these options in its context's cache."""
    return ("shm", opts.node_size, opts.shm_segment_bytes, opts.shm_cma_bytes)


def team(ctx: Context, opts: Options) -> Team:
    """The communicator's shm team for these options, created (collectively) on first use.

    Raises
    ------
    ValueError
        Some ranks are not on rank 0's node (every rank raises it, with the same message).
    """
    key = team_key(opts)
    found = ctx.cache.get(key)  # the per-call path: one lookup, no closure
    if found is None:
        found = ctx.cached(key, lambda comm: _make_team(ctx, opts))
    if type(found) is str:  # the verdict of every rank together: each raises it, no notice
        raise everywhere(ValueError, found)
    return found


def _make_team(ctx: Context, opts: Options, touch: bool = False) -> Team | str:
    """The team, or the reason there is none (cached like a team, raised at every call)."""
    why = _why_not(ctx, opts)
    if why is not None:
        return why
    cma = opts.shm_cma_bytes if opts.shm_cma_bytes is not None else tuned_cma_bytes(ctx.comm)
    return Team(ctx.comm, opts.shm_segment_bytes, registry(ctx), touch, cma)


def tuned_cma_bytes(comm: Any) -> int | None:
    """The cross-memory attach threshold that ``collectives-tune`` measured for this many ranks
    on one node (the tuning file's ``shm_cma_bytes``), or None: the team's built-in one.
    Collective (rank 0 reads the file, every rank gets its verdict)."""
    from ..selection.network import read_entry

    entry = read_entry(comm, stacklevel=6)
    return None if entry is None else entry.shm_cma_bytes


def prepare(ctx: Context, opts: Options) -> None:
    """Make the communicator's team ahead of its first call, its pages written once
    (``collectives.preload(comm=...)``), if its ranks share a node and it has none yet
    (collective)."""
    key = team_key(opts)
    if key not in ctx.cache and on_one_node(ctx, opts):
        ctx.cached(key, lambda comm: _make_team(ctx, opts, touch=True))


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options,
              wait: bool = True) -> None:
    """``algorithm="shm"``; ``wait=False`` (what "auto" runs: :func:`allreduce_without_waiting`):
    on the interpreted round driver while the kernel compiles (see the module docstring)."""
    shm = team(ctx, opts)
    if not elementwise(op):  # bfloat16 words, a codec's sum: the window's kernels cannot
        FLAT["ring"](src, buf, op, ctx, opts)
        return
    opcode = layout.OPCODES[op.name]
    if type(buf) is not np.ndarray:  # CuPy: the window is host memory, so reduce a host copy
        host = src.get()
        allreduce(host, host, op, ctx, opts, wait)
        buf.set(host)
    else:
        shm.run(src, buf, opcode, *_mode(buf, shm), ctx.active, wait)


def _mode(buf: np.ndarray, shm: Team) -> tuple[int, int]:
    """The mode of an allreduce into ``buf`` on ``shm`` and its number of blocks."""
    return (layout.REPLICATED, 1) if buf.nbytes <= REPLICATE_BYTES else (layout.FUSED, shm.size)


def allreduce_without_waiting(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context,
                              opts: Options) -> None:
    """What "auto" runs for "shm": with ``team.BACKGROUND``, on the interpreted round driver
    while the kernel compiles, not waiting for it; else :func:`allreduce` itself."""
    allreduce(src, buf, op, ctx, opts, not shm_team.BACKGROUND)


class Lane:
    """The repeats of one decided shm allreduce on the same arrays (a remembered call, a plan's
    ``plan()``), as an algorithm function ``(src, dst, op, ctx, opts)``: what every call would
    look up again (the team, the op's code, the mode) is resolved once, and the round driver's
    kernel is called through its compiled entry (:meth:`Team.compiled`), without Numba's
    dispatcher, which types all ten arguments at every call. Until this process has that entry
    (the first calls, or while the kernel compiles: the interpreted driver), while a test
    forces the interpreted driver (``team.INTERPRET``), and while observers of ``shm`` are
    registered (``observe.py``: the timeline, the schedule trace), it runs ``fn``, as the call
    would (observed in :meth:`Team.run`), so that the compiled entry has no observation point.

    Its callers keep the promise the entry needs: every call passes arrays of the Numba types of
    the first one's (the same dtype, dimensions, strides and alignment: a remembered call's
    re-checks, a plan's own views). The entry is taken only on the context it was found on
    (another one, as after ``reset``, runs ``fn``), which its callers use only while it lives.
    """

    __slots__ = ("fn", "ctx", "team", "entry", "opcode", "mode", "m", "kind")

    def __init__(self, fn: Any, opcode: int) -> None:
        self.fn, self.opcode = fn, opcode
        self.ctx = self.team = self.entry = None
        self.mode = self.m = self.kind = 0

    def __call__(self, src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context,
                 opts: Options) -> None:
        # the kernel's entry: on its context, unless a test forces the interpreted driver
        # (INTERPRET None or False) or shm's observers (observe.py) listen: then fn, which
        # they observe (Team.run)
        if ctx is self.ctx and not shm_team.INTERPRET and not _OBSERVED.shm:
            self.team.run_compiled(self.entry, src, buf, self.opcode, self.mode, self.m,
                                   self.kind, ctx.active)
            return
        self.fn(src, buf, op, ctx, opts)
        if self.entry is None:
            self._find(src, buf, ctx, opts)

    def _find(self, src: np.ndarray, buf: np.ndarray, ctx: Context, opts: Options) -> None:
        """After a call by ``fn``: the team it ran on and the kernel's entry, if compiled."""
        found = ctx.cache.get(team_key(opts))
        if type(found) is not Team or shm_team.INTERPRET:
            return
        mode, m = _mode(buf, found)
        compiled = found.compiled(src, buf, self.opcode, mode, m)
        if compiled is not None:
            self.team, self.mode, self.m = found, mode, m
            (self.entry, self.kind), self.ctx = compiled, ctx


def lane(fn: Any, src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context,
         opts: Options) -> Any:
    """``fn`` (this module's :func:`allreduce` or :func:`allreduce_without_waiting`, decided for
    a call on ``ctx``) for the repeats of that call on the same arrays (``lanes.lane``): a
    :class:`Lane` where the call can take one (NumPy arrays, an op the kernels have, not
    float16), else ``fn`` itself. The lane takes the kernel's entry at once if the team and the
    entry exist already."""
    if type(buf) is not np.ndarray or not elementwise(op) or buf.dtype == np.float16:
        return fn
    made = Lane(fn, layout.OPCODES[op.name])
    made._find(src, buf, ctx, opts)
    return made
