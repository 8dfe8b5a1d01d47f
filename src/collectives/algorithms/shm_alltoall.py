"""The shared-memory alltoall: each rank copies its block of every other rank's input straight
into its own output.

On one node MPI's alltoall moves every block through its shared-memory transport, which copies
each message twice (the sender into a shared cell, the cell into the receiver), one message per
peer. Here the ranks use the team of the shm allreduce (``algorithms/shm.py``: an MPI-3 shared
window, flags in it, the protocol of docs/shm-protocol.md) in its two alltoall modes
(``_runtime/shmem/layout.py``), one call of the round driver's kernel per alltoall:

- **by cross-memory attach** (``ALLTOALL_CMA``, from :data:`CMA_BLOCK_BYTES` per block, 8 KiB,
  where every rank may ``process_vm_readv`` the others; 64 KiB where ranks share cores): each
  rank publishes the address of its input in its descriptor and raises its ``READY`` counter;
  rank ``r`` then reads block ``r`` of each peer's input straight into block ``q`` of its own
  output, one system call per peer (the kernel
  copies from the other process's pages: **each byte copied once**), and raises ``DONE``. It
  returns once every rank's ``DONE`` has reached the call, so that no rank reuses (or frees) its
  input while a peer still reads it.
- **through the slots** (``ALLTOALL``: smaller blocks, or where cross-memory attach is not
  allowed): per round each rank stages a segment of each of its blocks into its input slot and
  raises ``READY``; rank ``r`` copies segment ``t`` of block ``r`` from every peer's slot into
  its output, then raises ``DONE``. Blocks longer than a slot's share
  (``Options.shm_segment_bytes`` / p) go in rounds, two slots in turn, so staging round ``t+1``
  overlaps the copies of round ``t``. An input that lives in shared memory
  (``collectives.empty``) is read in place, staged by no one.

**The v form** (``counts=``: blocks of any length, zero included; the caller gives both
sides' offsets, ``api.AlltoallCall`` having learned the receive counts) runs in the kernel's
``ALLTOALLV`` mode: each rank publishes its send and receive offsets in its offset table in the
window (``_runtime/shmem/layout.py``), and at its first round every rank compares, for every
pair of ranks, what one sends with what the other expects, before any rank reads another's
data: a mismatch raises the same ``ValueError`` on every rank (every rank scans the same pairs
in the same order). Then each block by its own length, the same on both sides:

- from :func:`block_cma_bytes` per block (8 KiB, 64 KiB where ranks share cores; or
  ``Options.shm_cma_bytes`` / p) by cross-memory attach: the reader takes the whole block, in
  its first round, from the sender's input at the sender's displacement (its offset table)
  into its output at its own displacement, one system call; a sender with such a block waits at
  the end for every rank's ``DONE``. A per-block choice, not one per call by the largest block:
  both ends of a block know its length, while the largest block of the call is known to no rank
  without one more exchange; and one long block then does not send the short ones through
  system calls that cost more than their two copies;
- shorter blocks through the slots, in rounds: each round stages up to a slot-share
  (``Options.shm_segment_bytes`` / p) of each of them, segment ``t`` of a block at its
  block's place in the slot. A rank takes as many rounds as its own blocks need (the longest it
  sends or receives through the slots); one whose blocks are all done raises its counters to
  the call's last round, so that it still takes part in the hand-offs (others read its last
  slots, wait on its ``DONE``) without being waited for in rounds it does not have.

An input in shared memory (``collectives.empty``) is read in place, each block whole in the
first round, staged by no one. Python checks every offset against the arrays before the kernel
(which does not check bounds): the kernel reads and writes only inside the blocks they give,
and reads a peer's block only once the counts agree.

Data travels as bytes (one compiled kernel for every dtype, the shm barrier's); the call's
descriptor names the element dtype and the byte count, which every rank compares with its own
(equal blocks; the v form compares the dtype and the blocks' counts) before it reads a peer's
data (a mismatch raises on every rank). In place (``out=x``, equal blocks only) the caller hands
a private copy of the input (``api.AlltoallCall``), as to every alltoall algorithm.

Cost per rank, ``n`` bytes of input, ``p`` ranks: by cross-memory attach ``n (p-1)/p`` bytes
read from the other processes and written once, ``p - 1`` system calls and two hand-offs (arrive,
done); through the slots ``2 n (p-1)/p beta`` (stage, copy: MPI's two copies, without its
per-message matching and with no message at all) and two hand-offs per round. A small alltoall
costs one kernel call and a few cache lines read from each peer, no MPI call. The v form adds
the comparison of the counts (``p^2`` words read from the offset tables, in the first round)
and, in ``collectives.alltoall``, the exchange of the receive counts that precedes it: one
more call of this alltoall, of one int64 per rank (:func:`setup`), no MPI message either.

Only on a communicator whose ranks share one node (else the same ``ValueError`` on every rank,
naming the ranks off rank 0's node). "auto" runs it on one node
(:func:`collectives.algorithms.auto.alltoall`), equal blocks and the v form, without waiting
for its kernel to compile (the interpreted round driver meanwhile, as the shm allreduce's
"auto"); the v form makes the team (:func:`setup`)
before the receive counts' exchange, after which one rank may raise alone. A remembered call
(equal blocks or the v form) resolves once to a :class:`Lane`, which calls the kernel's
compiled entry directly, as does the receive counts' exchange of the v form.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from .._runtime.context import Context
from .._runtime.shmem import layout
from .._runtime.shmem import team as shm_team
from .._runtime.shmem.team import Team
from ..observe import OBSERVERS as _OBSERVED
from ..options import Options
from . import shm

__all__ = ["alltoall", "alltoall_without_waiting", "setup", "setup_without_waiting", "lane",
           "Lane", "mode", "block_cma_bytes", "resolved", "CMA_BLOCK_BYTES",
           "CMA_BLOCK_BYTES_SHARED"]

#: Bytes per block from which an alltoall reads private inputs by cross-memory attach (where the
#: team may), when the team's ranks have a core each, and when they share cores: below it the
#: slots' two copies cost less than ``p - 1`` system calls and the wait for every peer's
#: ``DONE``, which costs a turn of the scheduler where ranks share cores
#: (docs/benchmarks/alltoall.md). ``Options.shm_cma_bytes`` sets it instead, as bytes of the
#: whole input (0: every size; one above any call: never).
CMA_BLOCK_BYTES, CMA_BLOCK_BYTES_SHARED = 8 << 10, 64 << 10


def mode(team: Team, nbytes: int, opts: Options) -> int:
    """The team's mode for an alltoall of ``nbytes`` bytes of input (the same on every rank:
    the bytes are, and the team agreed on whether cross-memory attach works)."""
    if not team.cma:
        return layout.ALLTOALL
    if opts.shm_cma_bytes is not None:
        at = opts.shm_cma_bytes
    else:
        at = (CMA_BLOCK_BYTES if team.dedicated else CMA_BLOCK_BYTES_SHARED) * team.size
    return layout.ALLTOALL_CMA if nbytes >= at else layout.ALLTOALL


def _code(dtype: np.dtype) -> int:
    """The element dtype's code in the call's kind (its "op" byte, ``layout.kind``): NumPy's
    number, 255 for the numbers that do not fit a byte (``ml_dtypes``' bfloat16: 256 and up),
    which would spill into the mode's byte."""
    return min(dtype.num, 255)


_U8 = np.dtype(np.uint8)


def _bytes(a: np.ndarray) -> np.ndarray:
    """The 1-D contiguous array ``a`` as bytes (``api.flat``'s views are 1-D and contiguous)."""
    return a.view(_U8)


def block_cma_bytes(team: Team, opts: Options) -> int:
    """Bytes of one block from which the v form reads it by cross-memory attach (the same on
    every rank: the options and the team's agreement are), :func:`mode`'s threshold per block:
    ``Options.shm_cma_bytes`` / p where set."""
    if opts.shm_cma_bytes is not None:
        return opts.shm_cma_bytes // team.size
    return CMA_BLOCK_BYTES if team.dedicated else CMA_BLOCK_BYTES_SHARED


def _checked(offsets: Sequence[int], p: int, size: int, what: str) -> None:
    """Check that ``offsets`` are ``p + 1`` ascending offsets from 0 or more inside an array of
    ``size`` elements: the kernel does not check bounds, it reads and writes what they say.
    (A loop: the v form's offsets come as a short list, which NumPy would first convert.)"""
    last = 0
    if len(offsets) == p + 1:
        for at in offsets:
            if at < last:
                break
            last = at
        else:
            if last <= size:
                return
    raise ValueError(f"shm alltoall: {what} offsets {list(offsets)} are not {p + 1} "
                     f"ascending offsets from 0 on inside an array of {size} elements")


def alltoall(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
             recvoffsets: Sequence[int] | None, ctx: Context, opts: Options,
             wait: bool = True) -> None:
    """``algorithm="shm"``: block ``j`` of ``src`` to block ``rank`` of rank ``j``'s ``dst``
    (equal blocks: ``recvoffsets`` None; else the v form, blocks ``sendoffsets[j]`` to
    ``sendoffsets[j + 1]`` of ``src`` and ``recvoffsets[i]`` to ``recvoffsets[i + 1]`` of
    ``dst``, checked here, their counts compared across ranks by the kernel before any data
    moves: a ``ValueError`` on every rank where they disagree). ``wait=False`` (what "auto"
    runs: :func:`alltoall_without_waiting`): on the interpreted round driver while the kernel
    compiles."""
    team = shm.team(ctx, opts)
    if type(dst) is not np.ndarray:  # CuPy: the window is host memory, exchange host copies
        host, got = src.get(), np.empty(dst.shape, dst.dtype)
        alltoall(host, got, sendoffsets, recvoffsets, ctx, opts, wait)
        dst.set(got)
        return
    x, out = _bytes(src), _bytes(dst)
    p, code = team.size, _code(src.dtype)
    if recvoffsets is None:
        how = mode(team, x.nbytes, opts)
    else:
        _checked(sendoffsets, p, src.size, "send")
        _checked(recvoffsets, p, dst.size, "receive")
        team.exchange(sendoffsets, recvoffsets, block_cma_bytes(team, opts), src.itemsize)
        how = layout.ALLTOALLV
    # the kernel's compiled entry where this process has it (the dispatcher would type the ten
    # arguments at every call: tens of microseconds), as a remembered call's lane takes it
    found = None if shm_team.INTERPRET or _OBSERVED.shm else team.compiled(x, out, code, how, p)
    if found is not None:
        team.run_compiled(found[0], x, out, code, how, p, found[1], ctx.active)
    else:
        team.run(x, out, code, how, p, ctx.active, wait)


def setup(ctx: Context, opts: Options, wait: bool = True) -> Callable[[np.ndarray, np.ndarray],
                                                                      None]:
    """The collective part of a first call on ``ctx`` (the team, :func:`shm.team`), which the v
    form makes before its receive counts' exchange: after it a rank may raise alone (its
    ``out`` of the wrong size), and none may then be in a collective step the others skip.
    Returns that exchange, ``(sent, got)`` (int64, one per rank), an alltoall of equal blocks
    through the team (one kernel call of 8-byte blocks: no MPI message) as the context's one
    :class:`Lane` of it, which runs on the kernel's compiled entry once it has it (every call
    passes p int64s); ``wait`` as :func:`alltoall`'s."""
    shm.team(ctx, opts)
    key = ("shm alltoall: the counts", wait, shm.team_key(opts))  # one lane per context
    run = ctx.cache.get(key)
    if run is None:
        run = ctx.cache[key] = Lane(partial(alltoall, wait=wait), False)
    return lambda sent, got: run(sent, got, (), None, ctx, opts)


def setup_without_waiting(ctx: Context, opts: Options) -> Callable[[np.ndarray, np.ndarray],
                                                                     None]:
    """What "auto"'s v form sets up on one node: :func:`setup`, whose exchange of the counts
    does not wait for the kernel to compile (as :func:`alltoall_without_waiting`)."""
    return setup(ctx, opts, not shm_team.BACKGROUND)


def alltoall_without_waiting(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
                             recvoffsets: Sequence[int] | None, ctx: Context,
                             opts: Options) -> None:
    """What "auto" runs on one node: :func:`alltoall` on the interpreted round driver while the
    kernel compiles (with ``team.BACKGROUND``), not waiting for it."""
    alltoall(src, dst, sendoffsets, recvoffsets, ctx, opts, not shm_team.BACKGROUND)


class Lane:
    """The repeats of one decided shm alltoall on the same arrays (a remembered call), as an
    alltoall function ``(src, dst, sendoffsets, recvoffsets, ctx, opts)``: the team, the mode and
    the kernel's compiled entry (:meth:`Team.compiled`) are found once, as the shm allreduce's
    :class:`~collectives.algorithms.shm.Lane` finds them. Equal blocks (``v`` False) or the v
    form (``v``: the offsets of each call checked against the arrays and published in the
    team's offset tables, :meth:`Team.exchange`, as :func:`alltoall` does). Until this process
    has the entry, while a test forces the interpreted driver (``team.INTERPRET``), while
    observers of ``shm`` listen, or on another context, it runs ``fn``. Its callers pass
    arrays of the first call's Numba types and (equal blocks) sizes (a remembered call's
    re-checks); it keeps no array alive.
    """

    __slots__ = ("fn", "v", "ctx", "team", "entry", "kind", "mode", "far", "code")

    def __init__(self, fn: Any, v: bool) -> None:
        self.fn, self.v = fn, v
        self.ctx = self.team = self.entry = None
        self.kind = self.mode = self.far = self.code = 0

    def __call__(self, src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
                 recvoffsets: Sequence[int] | None, ctx: Context, opts: Options) -> None:
        if ctx is self.ctx and not shm_team.INTERPRET and not _OBSERVED.shm:
            team = self.team
            if self.v:
                _checked(sendoffsets, team.size, src.size, "send")
                _checked(recvoffsets, team.size, dst.size, "receive")
                team.exchange(sendoffsets, recvoffsets, self.far, src.itemsize)
            team.run_compiled(self.entry, src.view(_U8), dst.view(_U8), self.code, self.mode,
                              team.size, self.kind, ctx.active)
            return
        self.fn(src, dst, sendoffsets, recvoffsets, ctx, opts)
        if self.entry is None:
            self._find(src, dst, ctx, opts)

    def _find(self, src: np.ndarray, dst: np.ndarray, ctx: Context, opts: Options) -> None:
        """After a call by ``fn``: the team it ran on and the kernel's entry, if compiled."""
        found = ctx.cache.get(shm.team_key(opts))
        if type(found) is not Team or shm_team.INTERPRET or type(dst) is not np.ndarray:
            return
        x, out = _bytes(src), _bytes(dst)
        how = layout.ALLTOALLV if self.v else mode(found, x.nbytes, opts)
        code = _code(src.dtype)  # (every call's arrays have the first one's dtype)
        compiled = found.compiled(x, out, code, how, found.size)
        if compiled is not None:
            self.team, self.mode, self.code = found, how, code
            self.far = block_cma_bytes(found, opts)
            (self.entry, self.kind), self.ctx = compiled, ctx


def lane(fn: Any, src: np.ndarray, dst: np.ndarray, ctx: Context, opts: Options,
         v: bool = False) -> Any:
    """``fn`` (:func:`alltoall` or :func:`alltoall_without_waiting`, decided for a call on
    ``ctx``) for the repeats of that call on the same arrays, of equal blocks or (``v``) the v
    form: a :class:`Lane` that takes the kernel's entry at once if the team and the entry exist
    already."""
    made = Lane(fn, v)
    made._find(src, dst, ctx, opts)
    return made


def resolved(src: np.ndarray, dst: np.ndarray, ctx: Context, opts: Options,
             v: bool = False) -> Any:
    """What a remembered ``algorithm="shm"`` alltoall on ``src`` and ``dst`` repeats (``v``: of
    the v form)."""
    return lane(alltoall, src, dst, ctx, opts, v)
