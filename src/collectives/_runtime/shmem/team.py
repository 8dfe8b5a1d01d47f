"""A team: ranks of one node that reduce through an MPI-3 shared window, synchronised by flags.

The window (``MPI.Win.Allocate_shared``, one segment per rank; layout in ``layout.py``) holds
each rank's control block, a scratch area and a few input and output slots. A call is split into
*rounds*; round ``t`` covers segment ``t`` of each of the ``m`` blocks of the vector (block ``b``
is reduced by rank ``b``). Per round rank ``r`` *stages* its input segments into its input slot
(unless its input lies in shared memory), *reduces* segment ``t`` of block ``r`` from all ``p``
inputs in rank order, and *copies out* the other blocks' segments (unless its output is shared).
Each rank's counters ``READY``, ``DONE`` and ``FREED`` (last round staged, reduced, copied out),
written with release stores and read with acquire loads, gate the steps: no barrier and no MPI
call per round. The Numba kernels (``kernels/``) run the rounds; a :class:`Team` sets the window
up, waits between kernel calls and raises the errors. docs/shm-protocol.md states the protocol
in full (call numbering, slot reuse, mismatches, cross-memory attach, waiting) and proves it
correct under MPI's memory model.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from ..guard import CollectiveError, Guard
from ...observe import OBSERVERS as _OBSERVED
from . import layout as L

__all__ = ["Team", "OPCODES"]

OPCODES = L.OPCODES

#: Default slot size (``Options.shm_segment_bytes`` None) when the team's ranks have a core each,
#: per rank (64 KiB of every block a round: rounds that stay in the cores' caches and overlap
#: the three steps), and when they share cores: there every round costs a turn of the scheduler,
#: so fewer, larger rounds (docs/benchmarks/shm.md).
SLOT_DEDICATED_PER_RANK, SEGMENT_SHARED = 64 << 10, 4 << 20
#: A round's bytes by cross-memory attach, which stages nothing (the bounce buffer's size), when
#: the team's ranks have a core each: each round costs two system calls per rank, so rounds of
#: 1 MiB (with shared cores, and under ``Options.shm_segment_bytes``: a slot's bytes).
SEGMENT_DEDICATED = 1 << 20
#: Bytes apart that reading one byte touches every page (4 KiB, the smallest x86-64 page).
PAGE = 4096
#: Where in a page a rank's bounce buffer (cross-memory attach's landing place for the other
#: ranks' segments) starts: half a page in, away from where allocators start user buffers
#: (NumPy 16 bytes in, PyTorch 64), which near the bounce buffer's offset made the path slower
#: (measured: docs/benchmarks/overhead.md, "The tensor line (stop 64)")
BOUNCE_OFFSET = 2048
#: Bytes from which an allreduce moves private buffers by cross-memory attach (where it beats the
#: slots), when the team's ranks have a core each, and when they share cores: there its extra wait
#: at the end of a call costs a turn of the scheduler (docs/benchmarks/shm.md, shm thresholds).
CMA_DEDICATED, CMA_SHARED = 512 << 10, 16 << 20
#: ... when they have a core each under MPICH, whose shared windows' slots beat cross-memory
#: attach further up than Open MPI's (docs/benchmarks/shm.md, shm thresholds)
CMA_DEDICATED_MPICH = 4 << 20
#: Polls without progress (about 2 ns each) before ``run_rounds`` returns to Python to yield:
#: about 100 us when every rank of the team can have a core of its own, well under 1 us when they
#: cannot (then the rank waited for may need this very core); longer spins keep other jobs'
#: processes waiting behind ours (docs/benchmarks/shm.md, shm thresholds).
SPIN_DEDICATED, SPIN_SHARED = 50_000, 200
#: Waiting longer than this (seconds) in one call, yield by sleeping instead.
YIELD_FOR = 2e-3
NAP = 50e-6
#: Seconds to wait for the notice of a rank that left a call unfinished (its failure is certain:
#: only a rank that never sends one, a killed process, makes a call wait this long).
NOTICE_GRACE = 3.0
#: Seconds :meth:`Team.ready` waits for the round driver of a new dtype where it cannot tell
#: whether Numba's cache holds it (a load takes a fraction of a second, a compile seconds).
READY_WAIT = 1.0
#: ``COLLECTIVES_JIT_BACKGROUND`` (read at import; default 1, 0: off): the calls that may run
#: while their kernel compiles (``run``'s ``wait`` False: "auto"'s shm, hierarchical's phases) do
#: so on the interpreted driver; off, they wait for the compile as the others do.
BACKGROUND = os.environ.get("COLLECTIVES_JIT_BACKGROUND", "1").strip() != "0"
#: Which round driver every call of this process runs: None, the kernel, or the interpreted one
#: while the kernel compiles where the caller does not wait (``run``'s ``wait``); True, the
#: interpreted one always; False, the kernel always (the tests set it per rank, so that ranks on
#: either driver meet in one call).
INTERPRET: bool | None = None

_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_clock = time.perf_counter

_DTYPES = {np.dtype(c).num: np.dtype(c).name for c in np.typecodes["All"] if c not in "OMmV"}
_OPS = {0: "sum", 1: "prod", 2: "min", 3: "max"}
_COMPLETE, _FLOAT16 = L.COMPLETE, np.dtype(np.float16).num
_T_PHASE = L.T_PHASE
_MODES = {L.FUSED: "allreduce", L.REDUCE_SCATTER: "reduce-scatter", L.ALLGATHER: "allgather",
          L.REPLICATED: "allreduce", L.ALLTOALL: "alltoall", L.ALLTOALL_CMA: "alltoall",
          L.ALLTOALLV: "alltoall with counts"}
_KERNELS: Any = None


def _observed(observers: tuple, comm: MPI.Comm, mode: int, nbytes: int, t0: float) -> None:
    """Tell the observers of ``shm`` (``observe.py``: the timeline, the schedule
    trace) of a pass in ``mode`` over ``nbytes`` bytes from ``t0`` to now."""
    t1 = _clock()
    for observe in observers:
        observe(comm, mode, nbytes, t0, t1)


def _cma_bytes(dedicated: bool) -> int:
    """The team's cross-memory attach threshold (:data:`CMA_DEDICATED` ...); the same on every
    rank, which all load the same MPI library."""
    if not dedicated:
        return CMA_SHARED
    from ..mpilib import mpi_library

    return CMA_DEDICATED_MPICH if mpi_library().vendor == "MPICH" else CMA_DEDICATED


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


def _typed(a: np.ndarray) -> tuple:
    """What Numba's type of the NumPy array ``a`` as an argument is made of: its dtype,
    dimensions, memory order (C, F or neither), alignment and write flag."""
    flags = a.flags
    return (a.dtype, a.ndim, flags.c_contiguous, flags.f_contiguous, flags.aligned,
            flags.writeable)


class Team:
    """The ranks of ``comm`` (all on one node) with their shared window and round counters.

    ``slot_bytes``: requested segment size (``Options.shm_segment_bytes``; None: the default for
    whether the team's ranks have a core each). ``buffers``: the
    registry of ``collectives.empty`` arrays whose ranks' buffers this team may read and write
    in place (None: every buffer is staged). ``touch``: write this rank's slots and bounce
    buffer once here, so that no call pays their first touch (page faults; what
    ``collectives.preload(comm=...)`` asks for). ``cma_bytes``: the allreduce's cross-memory
    attach threshold (``Options.shm_cma_bytes``; None: :func:`_cma_bytes`'s default; unused
    where cross-memory attach does not work). Collective; :meth:`free` releases the window.
    """

    def __init__(self, comm: MPI.Comm, slot_bytes: int | None, buffers: Any = None,
                 touch: bool = False, cma_bytes: int | None = None) -> None:
        p, me = comm.size, comm.rank
        if p > L.MAX_TEAM:
            raise ValueError(f"shared-memory collectives take at most {L.MAX_TEAM} ranks per "
                             f"node, got {p}")
        self.comm, self.size, self.buffers = comm, p, buffers
        #: whether every rank of the team can have a core of its own (the same on every rank)
        self.dedicated = dedicated = p <= (os.cpu_count() or 1)
        cma_round = slot_bytes
        if slot_bytes is None:
            slot_bytes = SLOT_DEDICATED_PER_RANK * p if dedicated else SEGMENT_SHARED
            cma_round = SEGMENT_DEDICATED if dedicated else slot_bytes
        slot = L.segment_bytes(slot_bytes, p)
        cma_round = max(L.segment_bytes(cma_round, p), slot)
        self.win = MPI.Win.Allocate_shared(L.window_bytes(slot, p), 1, comm=comm)
        if self.win.Get_attr(MPI.WIN_MODEL) != MPI.WIN_UNIFIED:  # pragma: no cover - no such MPI
            self.win.Free()
            raise RuntimeError("algorithm 'shm' needs MPI shared windows in the unified memory "
                               "model; this MPI library's are separate")
        self.win.Lock_all(MPI.MODE_NOCHECK)
        mine = np.frombuffer(self.win.Shared_query(me)[0], np.uint8)
        mine[:L.CTRL_BYTES] = 0
        if touch:  # before the barrier below: no rank reads another's slots before it
            mine[L.DATA_OFFSET:] = 0
        self.win.Sync()
        comm.Barrier()
        self.win.Sync()
        if touch:  # and this process's mappings of the others' slots: a read of every page
            for q in range(p):
                if q != me:
                    theirs = np.frombuffer(self.win.Shared_query(q)[0], np.uint8)
                    int(theirs[L.DATA_OFFSET::PAGE].max(initial=0))
        self.tab = np.zeros(L.table_words(p), np.int64)
        spin = SPIN_DEDICATED if dedicated else SPIN_SHARED
        self.tab[[L.T_ME, L.T_P, L.T_SLOTS, L.T_SLOT_BYTES, L.T_SPIN]] = (me, p, L.SLOTS, slot,
                                                                          spin)
        self.tab[L.T_STREAM] = L.STREAM_BYTES
        self.tab[L.T_CMA_SEGMENT] = cma_round
        self.tab[L.T_BASE:L.T_BASE + p] = [self.win.Shared_query(q)[0].address for q in range(p)]
        self.cma = _cma_works(comm, self.tab)
        self.tab[L.T_CMA] = np.iinfo(np.int64).max  # never
        if self.cma:  # two iovecs, then room for the other ranks' segments of a round
            # the bounce buffer's bytes start BOUNCE_OFFSET into a page, the iovecs before them
            self._bounce = np.zeros((64 + PAGE + cma_round) // 8, np.int64)
            if touch:
                self._bounce.fill(0)  # np.zeros of this size maps pages it has not written
            start = self._bounce.ctypes.data + 64
            self.tab[L.T_BOUNCE] = start + (BOUNCE_OFFSET - start) % PAGE
            self.tab[L.T_CMA] = _cma_bytes(dedicated) if cma_bytes is None else cma_bytes
        self._ranks = (None if buffers is None else
                       buffers.translate(comm))  # team rank -> rank in the buffers' node
        self._regions = np.zeros((0, 1 + p), np.int64)
        self._itemsize = 1  # the last v form's element bytes (:meth:`exchange`)
        self._version = -1
        #: (dtype number, input writable) of the calls whose round driver this rank has
        #: compiled (``ready``): they need not ask again
        self.warm: set[tuple[int, bool]] = set()
        #: :meth:`compiled`'s answers found so far, by the arrays' Numba types (:func:`_typed`)
        self.entries: dict[tuple, tuple[Any, int]] = {}
        #: the dtype of the last call run on the kernel (the next ones in it need not ask; one
        #: with a read-only input may still compile its own signature, waiting for it)
        self.last_warm: np.dtype | None = None

    def regions(self) -> np.ndarray:
        """The shared buffers this team can address: per row my size, then every rank's base."""
        if self.buffers is not None and self._version != self.buffers.version:
            self._regions = self.buffers.regions(self._ranks)
            self._version = self.buffers.version
        return self._regions

    def ready(self, x: np.ndarray, out: np.ndarray) -> bool:
        """Whether this rank's round driver runs a call on ``x`` and ``out`` without compiling:
        loaded from Numba's cache, or compiled by a background thread that the first question
        starts (``kernels/background.py``). Local: no other rank needs the same answer (a rank
        without the kernel runs the interpreted driver, the same protocol)."""
        from .kernels.background import ready

        key = (out.dtype.num, x.flags.writeable)
        if key in self.warm:
            return True
        token = out
        if out.dtype == np.float16:
            token = _kernels().FLOAT16
            x, out = x.view(np.uint16), out.view(np.uint16)
        seq = kind = 0
        if ready(_kernels().run_rounds, (self.tab, self.regions(), x, out, token, 0, 0, 1, seq,
                                         kind), READY_WAIT):
            self.warm.add(key)
            return True
        return False

    def _driver(self, x: np.ndarray, out: np.ndarray, wait: bool) -> Any:
        """The round driver of this call: the kernel, or while it compiles (``wait`` False, or
        :data:`INTERPRET`) the interpreted one (``kernels/interpreted.py``)."""
        from .kernels import interpreted

        if INTERPRET is not None:
            return interpreted.run_rounds if INTERPRET else _kernels().run_rounds
        if wait or self.ready(x, out) or not interpreted.supported():
            self.last_warm = out.dtype
            return _kernels().run_rounds
        return interpreted.run_rounds

    def run(self, x: np.ndarray, out: np.ndarray, opcode: int, mode: int, m: int,
            guard: Guard | None, wait: bool = True) -> None:
        """One collective call of this rank over flat contiguous host arrays (see ``layout``),
        as part of the public call of ``guard`` (None: outside one). ``wait`` False: should the
        round driver's kernel not be compiled yet, run the call on the interpreted driver
        instead of waiting for the compile (:meth:`_driver`).

        Raises
        ------
        ValueError
            Another rank's call differs (count, dtype, op, mode), or it needs more rounds than
            a call may have.
        """
        observers = _OBSERVED.shm  # -- observers (observe.py): off, this and the last test
        t0 = _clock() if observers else 0.0
        try:
            if INTERPRET is None and (wait or out.dtype is self.last_warm):
                run_rounds = _kernels().run_rounds
            else:
                run_rounds = self._driver(x, out, wait)
            tab = self.tab
            # run_rounds numbers the call: after its last one, and from seq * CALLS_PER_SEQ
            # inside public call number seq (agreed by every rank, also after a failure:
            # docs/shm-protocol.md)
            seq = -1 if guard is None else guard.seq
            kind = L.kind(out.dtype.num, opcode, mode, m)
            if kind & 0xFF == _FLOAT16:  # Numba has no float16: uint16 words, a format token
                token = _kernels().FLOAT16
                x, out = x.view(np.uint16), out.view(np.uint16)
            else:
                token = out
            regions = self.regions()
            tab[L.T_PHASE] = 0  # a new call (run_rounds then keeps call and kind in the table)
            status = run_rounds(tab, regions, x, out, token, opcode, mode, m, seq, kind)
            if status != _COMPLETE:
                self._rest(status, run_rounds, regions, x, out, token, opcode, mode, m, seq,
                           kind, guard)
        finally:
            if observers:
                _observed(observers, self.comm, mode, x.nbytes, t0)

    def compiled(self, x: np.ndarray, out: np.ndarray, opcode: int, mode: int,
                 m: int) -> tuple[Any, int] | None:
        """The kernel's compiled entry for a :meth:`run` on arrays of exactly the types of ``x``
        and ``out`` (Numba's: dtype, dimensions, memory order, alignment, write flag) and the
        call's kind, if this process has the entry (compiled or loaded), else None. Calling it
        skips the dispatcher, which types every argument at every call; it checks nothing: only
        for :meth:`run_compiled` with arrays of those types. Not float16 (run's word views).
        An entry found is kept by what decides those types (:func:`_typed`): Numba's typing
        of the ten arguments costs tens of microseconds, which a call that is remembered once
        and never repeats (a new output array at every step) would pay at each call."""
        key = (_typed(x), _typed(out), opcode, mode, m)
        found = self.entries.get(key)
        if found is not None:
            return found
        kernel = _kernels().run_rounds
        args = (self.tab, self.regions(), x, out, out, opcode, mode, m, 0, 0)
        overload = kernel.overloads.get(tuple(kernel.typeof_pyval(a) for a in args))
        if overload is None:
            return None
        found = self.entries[key] = overload.entry_point, L.kind(out.dtype.num, opcode, mode, m)
        return found

    def run_compiled(self, entry: Any, x: np.ndarray, out: np.ndarray, opcode: int, mode: int,
                     m: int, kind: int, guard: Guard | None) -> None:
        """:meth:`run` on the kernel's entry ``entry`` and the call's ``kind``, as
        :meth:`compiled` gave them for arrays of the types of ``x`` and ``out``. Unobserved:
        its caller (``algorithms/shm.py``'s lane) calls :meth:`run` instead while observers of
        ``shm`` are registered."""
        tab, buffers = self.tab, self.buffers
        # regions(), in line (every repeat runs this): a new buffer registered since, if any
        regions = self._regions if buffers is None or self._version == buffers.version \
            else self.regions()
        seq = -1 if guard is None else guard.seq
        tab[_T_PHASE] = 0
        status = entry(tab, regions, x, out, out, opcode, mode, m, seq, kind)
        if status != _COMPLETE:
            self._rest(status, entry, regions, x, out, out, opcode, mode, m, seq, kind, guard)

    def _rest(self, status: int, run_rounds: Any, regions: np.ndarray, x: np.ndarray,
              out: np.ndarray, token: Any, opcode: int, mode: int, m: int, seq: int, kind: int,
              guard: Guard | None) -> None:
        """The rest of a call whose first ``run_rounds`` returned ``status``, not COMPLETE:
        wait and call again while it is WAITING, then raise what a failed call raises."""
        tab = self.tab
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
        if status == L.COUNTS:  # every rank found the same pair (protocol.counts_agree)
            raise self._counts(guard)
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
        while True:  # and once more after the grace: this rank may have lost the processor
            guard.poll()  # for all of it (more ranks than cores), polling only at its start
            if time.monotonic() >= end:
                return
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
        if code >> 16 & 0xFF >= L.ALLTOALL:  # bytes; the "op" word holds the element dtype
            dtype, op = _DTYPES.get(code >> 8 & 0xFF, "?"), "copies"
        return int(words[L.D_BYTES]), f"{dtype} ({op}, {mode} of {code >> 24} blocks)"

    def _mismatch(self, guard: Any) -> ValueError:
        """The error of a call whose descriptor differs on rank ``tab[T_BAD]``."""
        me, q = self.comm.rank, int(self.tab[L.T_BAD])
        mine, theirs = self._describe(me), self._describe(q)
        name, names = "shm", [me, q]
        if guard is not None:  # name the ranks as the caller's communicator does
            name = guard.name
            names = self.comm.Get_group().Translate_ranks([me, q], guard.comm.Get_group())
        kinds = [int(self._descriptor(k)[0][L.D_KIND]) for k in (me, q)]
        if kinds[0] >> 16 & 0xFF == L.ALLTOALLV and kinds[0] == kinds[1]:  # (bytes may differ)
            what = ("the blocks' cross-memory attach threshold (Options.shm_cma_bytes) "
                    "differs")
        elif mine[0] != theirs[0] or mine[1].split()[0] != theirs[1].split()[0]:
            what = "count or dtype differs"
        else:
            what = "the call differs (op or mode)"
        return ValueError(f"{name}: {what} across ranks: rank {names[0]} has {mine[0]} bytes "
                          f"of {mine[1]}, rank {names[1]} has {theirs[0]} bytes of {theirs[1]}")

    def _counts(self, guard: Any) -> ValueError:
        """The error of an alltoall whose counts disagree (``tab[T_BAD]`` sends ``T_SENT``
        bytes to ``T_TO``, which expects ``T_WANT``), in elements of the call's dtype."""
        tab, itemsize = self.tab, self._itemsize
        a, b = int(tab[L.T_BAD]), int(tab[L.T_TO])
        sent, want = int(tab[L.T_SENT]) // itemsize, int(tab[L.T_WANT]) // itemsize
        name = "shm"
        if guard is not None:  # name the ranks as the caller's communicator does
            name = guard.name
            a, b = self.comm.Get_group().Translate_ranks([a, b], guard.comm.Get_group())
        return ValueError(f"{name}: alltoall counts differ across ranks: rank {a} sends {sent} "
                          f"elements to rank {b}, which expects {want} from it")

    def exchange(self, sends: Any, got: Any, far: int, itemsize: int) -> None:
        """Set the next ``ALLTOALLV`` call's blocks: block ``b`` is elements ``sends[b]`` to
        ``sends[b + 1]`` of the input and ``got[b]`` to ``got[b + 1]`` of the output (each
        ``p + 1`` of them, checked by the caller against its arrays: the kernel reads and writes
        what they say), of ``itemsize`` bytes each; from ``far`` bytes a block is read by
        cross-memory attach (a huge value: never; only where the team may)."""
        p, tab = self.size, self.tab
        at = L.T_BASE + 3 * p
        tab[at:at + p + 1] = sends
        tab[at + p + 1:at + 2 * p + 2] = got
        if itemsize != 1:
            tab[at:at + 2 * p + 2] *= itemsize
        tab[L.T_A2A_CMA] = far if self.cma else np.iinfo(np.int64).max
        self._itemsize = itemsize

    def free(self) -> None:
        """Release the window (collective over the team's communicator) and the bounce buffer:
        a freed team may stay referenced (a remembered call's lane) but holds no memory."""
        if self.win != MPI.WIN_NULL:
            self.win.Unlock_all()
            self.win.Free()
        self.tab[L.T_CMA] = np.iinfo(np.int64).max  # never: the bounce buffer is gone
        self.tab[L.T_BOUNCE] = 0
        self._bounce = None
