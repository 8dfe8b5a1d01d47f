"""A team: ranks of one node that reduce through an MPI-3 shared window, synchronised by flags.

The window (``MPI.Win.Allocate_shared``, one segment per rank; layout in ``layout.py``) holds
each rank's control block, a scratch area and a few input and output slots. A call is split into
*rounds*; round ``t`` covers segment ``t`` of each of the ``m`` blocks of the vector (block ``b``
is reduced by rank ``b``).

**Calls and rounds are numbered alike on every rank, also after a failure.** A team call made
inside public call number ``seq`` of the guard (``_runtime/guard.py``, which numbers public calls the
same on every rank whether they fail or not) is number ``seq * CALLS_PER_SEQ`` (plus one per
earlier team call of the same public call), and its ``i``-th round is ``(call << ROUND_BITS) +
i``. So a counter never needs resetting: whatever an earlier call left behind, finished or
failed half-way on some ranks, is smaller than every round of this one, and a stale counter can
never pass for this call's.

**Slots and descriptors are reused only once nobody reads them.** A rank first writes the
call's number into its ``ENTER`` word. It numbers its slot uses privately: round ``i`` of the
call uses slot ``(D_SLOT0 + i) mod SLOTS`` (in and out), ``D_SLOT0`` published in its
descriptor, and it remembers, for each slot, the last round it put there. It stages into an
input slot only when every other rank's ``DONE`` has reached that last round, or that rank has
entered a later call than the round's (then it reads nothing of it any more, finished or
failed); likewise an output slot with ``FREED``. The descriptor (where the input and output
lie, and the call's number, byte count, kind and ``D_SLOT0``) has two copies used by turns, each
marked with its call's number; a rank rewrites one only when every other rank has entered a
later call than the one that last used it (two calls back), and readers take the copy marked
with their own call. In a run of successful calls none of these waits ever waits (a rank
finishes a call only once every rank has entered it), and consecutive calls still overlap:
these tests guard the same hand-offs as contiguous round numbers did before failures were
considered. The descriptor is published before the first ``READY`` of the call.

**Mismatches.** A rank compares every other rank's descriptor with its own before it reads
their data: at its first reduce (every rank's, after acquiring their ``READY``) and at its first
copy-out (the reducers', after their ``DONE``). A count, dtype, op or mode that differs, or
another call number, makes the engine stop with MISMATCH, and the rank raises ValueError naming
both ranks' calls (its notice reaches any rank still waiting). A rank that finds another already
in a *later* call knows that rank left this one unfinished (it failed); it waits briefly for
that rank's notice and raises its error instead.

Per round, rank ``r`` does three things, each gated by the others' counters:

- **stage** (input not in shared memory): copy its segment of every other block into its input
  slot of the round, then ``READY[r] = t``. The slot must first be free (above: within a call,
  ``DONE[q] >= t - SLOTS`` for every rank ``q``: none reads round ``t - SLOTS`` any more).
- **reduce** (``r < m``): once ``READY[q] >= t`` for every ``q``, combine segment ``t`` of block
  ``r`` from all ``p`` inputs in rank order, in one pass (``kernels.fold``), reading each input
  where it lies (its slot, or the rank's own shared buffer), and write the result to its own
  output, straight into every output that lies in shared memory, and into its output slot of
  the round if some rank needs to copy it (once free: ``FREED[q]`` past the slot's last round);
  then ``DONE[r] = t``.
- **copy out** (output not in shared memory): once ``DONE[b] >= t`` for all ``b``, copy every
  other block's segment of round ``t`` from the output slots, then ``FREED[r] = t``.

A step a rank does not take in a call (nothing to stage: its input is shared; nothing to reduce;
nothing to copy out) moves its counter to the call's last round at once, so that the invariants
hold in every mode: ``READY[q] >= t``: q's input of round t is readable and q's descriptor is
this call's; ``DONE[q] >= t``: q reads no input (and no descriptor) of rounds <= t any more;
``FREED[q] >= t``: q reads no output slot (and no descriptor) of rounds <= t any more. A rank
returns when it has done its steps for the call's last round and every ``DONE`` has reached it,
so no rank still reads its input or writes its output. (In the replicated mode for short
vectors, where every rank reduces the whole vector for itself and no one writes another's
output, a rank whose input was staged returns without that wait: its slots and descriptor are
guarded by the tests above when it reuses them.)

**Cross-memory attach** (long allreduces, ``CMA_DEDICATED`` bytes and up, or ``CMA_SHARED``
when ranks share cores, where every rank may
``process_vm_readv`` the others: Linux, ptrace rights; checked once per team, collectively).
Staging a private input costs a write into the slot and the reducer a read of it from another
core, and copying out the same again: twice the memory traffic of reading the input and
writing the result. Instead a rank publishes the addresses of its private input and output
(region ``CMA``) and stages nothing; a reducer reads every other rank's segment of its block
straight into a private bounce buffer with one system call each (the kernel copies from the
other process's pages), folds, and writes only its own output; a rank then reads every other
block's result straight out of its owner's output into its own (one more system call each).
Every rank writes only its own memory, so a rank that left a call (failed) can make another's
read fail (``CMA_FAILED``, raised after its notice) but never have its memory written. The
counters keep their meaning (``READY`` at arrival, as for a shared input), and the last wait
grows: since the others read a rank's output in place, it returns only once every ``FREED``
has reached the call's last round too. The system call is a full barrier between the acquire
load of the counter and the kernel's copy, so the memory-model argument below carries over.

That is the whole synchronisation: no barrier,
and no MPI call per round. The ``reduce-scatter`` and ``allgather`` modes of ``hierarchical``
take the first and the last two steps only.

**Why it is correct under MPI's memory model.** The window is created with
``MPI_Win_allocate_shared``, whose memory model must be ``MPI_WIN_UNIFIED`` (checked: public and
private copies are one memory), and each process holds a shared lock on it
(``Lock_all(MODE_NOCHECK)``) from creation to ``Free``, a passive-target epoch within which
load/store access is allowed. For load/store access to a shared window the standard (MPI-3.1,
section 11.7, the advice to users and the shared-memory example added by MPI Forum ticket 413)
orders the accesses with ``MPI_Win_sync``, a memory barrier, on each side of a process
synchronisation, and leaves the synchronisation itself to the program. Here that synchronisation
is a flag in the window written with a *release* store after the data and read with an *acquire*
load before the data: the LLVM (C11) atomics defined for exactly this, which keep the compiler
from caching the polled flag or moving data accesses across it and order them in the processor,
as the two barriers of a ``Win_sync`` pair would (MPICH's and Open MPI's ``MPI_Win_sync`` on
shared memory are a processor memory barrier: ``MPL_atomic_read_write_barrier``,
``opal_atomic_mb``). The zeroed control blocks are published by ``Win_sync`` + ``Barrier`` +
``Win_sync``, the standard's own pattern. The non-temporal stores that copy long results out
are weakly ordered; they only write the rank's own private output, and a full fence follows them
before the call returns.

**Waiting.** ``kernels.engine`` polls the counters for a bounded number of rounds without
progress (about 100 us when the team has no more ranks than the machine has cores; under 1 us
when it has more), then returns to Python, which yields the
processor (``os.sched_yield``) and, once it has waited 2 ms without progress, sleeps 50 us
before calling it again; a rank that waits for one that is not scheduled (more ranks than
cores) thus gives it the core instead of spinning its time slice away. While it sleeps it polls
the guard: a notice of a rank that failed this call raises, as does passing the call's
deadline (``Options.timeout``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from ..guard import CURRENT as _CALLS_NOW
from ..guard import CollectiveError
from . import layout as L

__all__ = ["Team", "OPCODES"]

OPCODES = L.OPCODES

#: Default slot size (``Options.shm_segment_bytes`` None) when the team's ranks have a core each,
#: and when they share cores (measured side by side at p = 4 on the loaded 2-core machine: 4 MiB
#: slots took 0.31-0.64x native's time, 1 MiB 0.38-0.77x, 256 KiB up to 3.8x; not in docs/).
SEGMENT_DEDICATED, SEGMENT_SHARED = 1 << 20, 4 << 20
#: Bytes from which an allreduce moves private buffers by cross-memory attach, when the team's
#: ranks have a core each, and when they share cores (measured side by side against the slots,
#: float32 sum, on the 2-core machine: p = 2, 0.88x the slots' time at 256 KiB, 0.77x at 512
#: KiB, 0.61x at 64 MiB; p = 4, 1.2-1.5x up to 4 MiB, 1.03x at 8 MiB, 0.85x at 16 MiB, 0.79x at
#: 64 MiB: there every rank waits for the others once more at the end of a call, a turn of the
#: scheduler; docs/benchmarks.md).
CMA_DEDICATED, CMA_SHARED = 512 << 10, 16 << 20
#: Polls without progress (about 2 ns each) before the engine returns to Python to yield: about
#: 100 us when every rank of the team can have a core of its own, well under 1 us when they
#: cannot (then the rank waited for may need this very core). Spinning for milliseconds was
#: 3-4x slower on a machine shared with other jobs, whose processes then wait behind ours.
SPIN_DEDICATED, SPIN_SHARED = 50_000, 200
#: Waiting longer than this (seconds) in one call, yield by sleeping instead.
YIELD_FOR = 2e-3
NAP = 50e-6
#: Seconds to wait for the notice of a rank that left a call unfinished.
NOTICE_GRACE = 1.0

_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_DTYPES = {np.dtype(c).num: np.dtype(c).name for c in np.typecodes["All"] if c not in "OMmV"}
_OPS = {0: "sum", 1: "prod", 2: "min", 3: "max"}
_COMPLETE, _FLOAT16 = L.COMPLETE, np.dtype(np.float16).num
_MODES = {L.FUSED: "allreduce", L.REDUCE_SCATTER: "reduce-scatter", L.ALLGATHER: "allgather",
          L.REPLICATED: "allreduce"}
_KERNELS: Any = None


def _kernels():
    """The round driver's kernels (``kernels/rounds.py``), imported (and Numba with them) on
    first use."""
    global _KERNELS
    if _KERNELS is None:
        from .kernels import rounds

        _KERNELS = rounds
    return _KERNELS


def _cma_functions() -> tuple[int, int] | None:
    """Addresses of the C library's ``process_vm_readv`` and ``__errno_location`` (Linux), or
    None where there are none."""
    if not sys.platform.startswith("linux"):  # pragma: no cover - macOS
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        return tuple(ctypes.cast(getattr(libc, name), ctypes.c_void_p).value  # type: ignore
                     for name in ("process_vm_readv", "__errno_location"))
    except (OSError, AttributeError):  # pragma: no cover - another C library
        return None


def _cma_works(comm: MPI.Comm, tab: np.ndarray) -> bool:
    """Whether every rank of ``comm`` can read the memory of the next one with
    ``process_vm_readv`` (collective; every rank gets the same answer). It needs Linux and the
    right to ptrace the other process (same user; Yama's ``ptrace_scope`` 0, or
    ``CAP_SYS_PTRACE``; a container's seccomp profile may forbid the call). Records the process
    ids and the C functions in ``tab``; ``COLLECTIVES_SHM_CMA=0`` switches it off."""
    p, me = comm.size, comm.rank
    functions = None if os.environ.get("COLLECTIVES_SHM_CMA", "1").lower() in ("0", "off") \
        else _cma_functions()
    probe = np.array([7919 * (me + 1)], np.int64)
    mine = np.array([os.getpid(), probe.ctypes.data], np.int64)
    every = np.empty((p, 2), np.int64)
    comm.Allgather(mine, every)
    tab[L.T_BASE + 2 * p:L.T_BASE + 3 * p] = every[:, 0]
    ok = np.zeros(1, np.int64)
    if functions is not None:
        import ctypes

        tab[L.T_READV], tab[L.T_ERRNO] = functions
        readv = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong,
                                 ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong)(functions[0])
        q = (me + 1) % p
        got = np.zeros(1, np.int64)
        iov = np.array([got.ctypes.data, 8, every[q, 1], 8], np.uint64)
        if readv(int(every[q, 0]), iov.ctypes.data, 1, iov.ctypes.data + 16, 1, 0) == 8:
            ok[0] = int(got[0] == 7919 * (q + 1))
    comm.Allreduce(MPI.IN_PLACE, ok, op=MPI.MIN)  # the next rank's probe lives until here
    return bool(ok[0])


class Team:
    """The ranks of ``comm`` (all on one node) with their shared window and round counters.

    ``slot_bytes``: requested segment size (``Options.shm_segment_bytes``; None: the default for
    whether the team's ranks have a core each). ``buffers``: the
    registry of ``collectives.empty`` arrays whose ranks' buffers this team may read and write
    in place (None: every buffer is staged). Collective; :meth:`free` releases the window.
    """

    def __init__(self, comm: MPI.Comm, slot_bytes: int | None, buffers: Any = None) -> None:
        p, me = comm.size, comm.rank
        if p > L.MAX_TEAM:
            raise ValueError(f"shared-memory collectives take at most {L.MAX_TEAM} ranks per "
                             f"node, got {p}")
        self.comm, self.size, self.buffers = comm, p, buffers
        dedicated = p <= (os.cpu_count() or 1)
        if slot_bytes is None:
            slot_bytes = SEGMENT_DEDICATED if dedicated else SEGMENT_SHARED
        slot = L.segment_bytes(slot_bytes, p)
        self.win = MPI.Win.Allocate_shared(L.DATA_OFFSET + 2 * L.SLOTS * slot, 1, comm=comm)
        if self.win.Get_attr(MPI.WIN_MODEL) != MPI.WIN_UNIFIED:  # pragma: no cover - no such MPI
            self.win.Free()
            raise RuntimeError("algorithm 'shm' needs MPI shared windows in the unified memory "
                               "model; this MPI library's are separate")
        self.win.Lock_all(MPI.MODE_NOCHECK)
        mine = np.frombuffer(self.win.Shared_query(me)[0], np.uint8)
        mine[:L.CTRL_BYTES] = 0
        self.win.Sync()
        comm.Barrier()
        self.win.Sync()
        self.tab = np.zeros(L.T_BASE + 3 * p, np.int64)
        spin = SPIN_DEDICATED if dedicated else SPIN_SHARED
        self.tab[[L.T_ME, L.T_P, L.T_SLOTS, L.T_SLOT_BYTES, L.T_SPIN]] = (me, p, L.SLOTS, slot,
                                                                          spin)
        self.tab[L.T_STREAM] = L.STREAM_BYTES
        self.tab[L.T_BASE:L.T_BASE + p] = [self.win.Shared_query(q)[0].address for q in range(p)]
        self.cma = _cma_works(comm, self.tab)
        self.tab[L.T_CMA] = np.iinfo(np.int64).max  # never
        if self.cma:  # two iovecs, then room for the other ranks' segments of a round
            self._bounce = np.zeros((64 + slot) // 8, np.int64)
            self.tab[L.T_BOUNCE] = self._bounce.ctypes.data + 64
            self.tab[L.T_CMA] = CMA_DEDICATED if dedicated else CMA_SHARED
        self._ranks = (None if buffers is None else
                       buffers.translate(comm))  # team rank -> rank in the buffers' node
        self._regions = np.zeros((0, 1 + p), np.int64)
        self._version = -1

    def regions(self) -> np.ndarray:
        """The shared buffers this team can address: per row my size, then every rank's base."""
        if self.buffers is not None and self._version != self.buffers.version:
            self._regions = self.buffers.regions(self._ranks)
            self._version = self.buffers.version
        return self._regions

    def run(self, x: np.ndarray, out: np.ndarray, opcode: int, mode: int, m: int) -> None:
        """One collective call of this rank over flat contiguous host arrays (see ``layout``).

        Raises
        ------
        ValueError
            Another rank's call differs (count, dtype, op, mode), or it needs more rounds than
            a call may have.
        """
        run_rounds = _kernels().run_rounds
        tab = self.tab
        guard = _CALLS_NOW.guard  # _guard.active(), inline: the per-call path
        # run_rounds numbers the call: after its last one, and from seq * CALLS_PER_SEQ inside
        # public call number seq (agreed by every rank, also after a failure: module docstring)
        seq = -1 if guard is None else guard.seq
        kind = out.dtype.num | (opcode << 8 | mode << 16 | m << 24)  # layout.D_KIND
        if kind & 0xFF == _FLOAT16:  # Numba has no float16: uint16 words and a format token
            token = _kernels().FLOAT16
            x, out = x.view(np.uint16), out.view(np.uint16)
        else:
            token = out
        regions = self.regions()
        tab[L.T_PHASE] = 0  # a new call (run_rounds then keeps call and kind in the table)
        status = run_rounds(tab, regions, x, out, token, opcode, mode, m, seq, kind)
        if status == _COMPLETE:
            return
        since, cursor = time.perf_counter(), None  # waiting without progress since
        while status == L.WAITING:
            moved = tab[L.T_PHASE] + tab[L.T_TS] + tab[L.T_TF] + tab[L.T_TC]
            if moved != cursor:
                since, cursor = time.perf_counter(), moved
            if time.perf_counter() - since < YIELD_FOR:
                _yield()
            else:
                time.sleep(NAP)
                if guard is not None:  # a rank that failed this call will never arrive: its
                    guard.poll()       # notice raises here (and a timeout, if one is set)
            status = run_rounds(tab, regions, x, out, token, opcode, mode, m, seq, kind)
        if status == L.MISMATCH:
            self._await_notice(guard)
            raise self._mismatch(guard)
        if status == L.CMA_FAILED:  # the rank read from has left the call (failed)
            self._await_notice(guard, always=True)
            q, errno = int(tab[L.T_BAD]), int(tab[L.T_ERR])
            raise CollectiveError(f"shm: reading rank {q}'s buffer of this call by "
                                  f"cross-memory attach failed ({os.strerror(errno)}): it "
                                  "left the call")
        if status == L.TOO_LONG:
            raise ValueError(f"a shared-memory call of {out.nbytes} bytes needs "
                             f"{1 << L.ROUND_BITS} rounds or more of {tab[L.T_SLOT_BYTES]}-byte "
                             "slots: raise Options.shm_segment_bytes")

    def _await_notice(self, guard: Any, always: bool = False) -> None:
        """A rank already in a later call (or, ``always``, the rank whose memory could not be
        read) left this one without finishing it: it failed, and its notice (or the one that
        made it raise) is on its way; raise that error rather than the one it caused (waiting
        at most ``NOTICE_GRACE`` seconds)."""
        if guard is None or not always and \
                self._descriptor(int(self.tab[L.T_BAD]))[1] <= self.tab[L.T_CALL]:
            return
        end = time.monotonic() + NOTICE_GRACE
        while time.monotonic() < end:
            guard.poll()
            time.sleep(NAP)

    def _descriptor(self, q: int) -> tuple[np.ndarray, int]:
        """Rank q's descriptor of this rank's current call and that copy's call number (as
        ``kernels.protocol._copy_of`` picks it: the copy of this call, else the newer one)."""
        words = np.frombuffer(self.win.Shared_query(q)[0], np.int64, L.D_CALLS + 2)
        calls = words[L.D_CALLS:L.D_CALLS + 2]
        mine = np.flatnonzero(calls == self.tab[L.T_CALL])
        copy = int(mine[0]) if mine.size else int(np.argmax(calls))
        return words[copy * L.DESCRIPTOR:(copy + 1) * L.DESCRIPTOR].copy(), int(calls[copy])

    def _describe(self, q: int) -> tuple[int, str]:
        """(byte count, 'dtype op mode') of rank q's current call, from its descriptor."""
        words = self._descriptor(q)[0]
        code = int(words[L.D_KIND])
        dtype = _DTYPES.get(code & 0xFF, f"dtype #{code & 0xFF}")
        op = _OPS.get(code >> 8 & 0xFF, "?")
        mode = _MODES.get(code >> 16 & 0xFF, "?")
        return int(words[L.D_BYTES]), f"{dtype} ({op}, {mode} of {code >> 24} blocks)"

    def _mismatch(self, guard: Any) -> ValueError:
        """The error of a call whose descriptor differs on rank ``tab[T_BAD]``."""
        me, q = self.comm.rank, int(self.tab[L.T_BAD])
        mine, theirs = self._describe(me), self._describe(q)
        name, names = "shm", [me, q]
        if guard is not None:  # name the ranks as the caller's communicator does
            name = guard.name
            names = self.comm.Get_group().Translate_ranks([me, q], guard.comm.Get_group())
        if mine[0] != theirs[0] or mine[1].split()[0] != theirs[1].split()[0]:
            what = "count or dtype differs"
        else:
            what = "the call differs (op or mode)"
        return ValueError(f"{name}: {what} across ranks: rank {names[0]} has {mine[0]} bytes "
                          f"of {mine[1]}, rank {names[1]} has {theirs[0]} bytes of {theirs[1]}")

    def free(self) -> None:
        """Release the window (collective over the team's communicator)."""
        if self.win != MPI.WIN_NULL:
            self.win.Unlock_all()
            self.win.Free()
