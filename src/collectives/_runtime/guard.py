"""Failure semantics: an error on one rank becomes an error on every rank that needs it.

Every public call on a communicator runs under that communicator's :class:`Guard` (kept on its
private context, :mod:`.context`):

- **Call sequence numbers.** Every rank numbers its calls on the communicator (at entry, before
  any check, so ranks stay in step whether a call fails or not) and every point-to-point message
  of call ``s`` carries tag ``1 + s % SPAN``. A message left behind by a failed call can never
  be received by a later one.
- **Notices.** Each guard keeps a receive posted for notices (tag 0). A rank whose call raises
  (anything: a bad argument only it can see, a decode failure, an exception in user code run
  by the call) sends a notice ``(seq, rank, type, arguments, message)`` to every other rank and
  re-raises (``arguments``: the error is a bad argument, found by the call's checks before it
  sent anything: :func:`argument_error`).
  Every wait of the library waits for its messages *or* a notice: a notice for the current
  call raises the same type on the receiver (TypeError, ValueError and TimeoutError keep their
  type; anything else becomes :class:`CollectiveError`) naming the rank and its message; a
  notice for an older call (this rank had finished it) is only recorded; one for a later call
  is kept until this rank gets there.
- **Exact sizes.** Receives are posted with the exact size the algorithm expects. A longer
  message (MPI_ERR_TRUNCATE) or a shorter one means that the ranks disagree on count or dtype:
  ``ValueError`` on the rank that sees it, and through its notice on every rank still waiting.
- **The MPI library's own collectives** ("native") run as non-blocking collectives with the same
  notice-aware wait. MPI cannot cancel a collective, and one that a rank skipped would pair up
  wrongly with the next; so once a rank knows of any failure on the communicator (its own or
  a notice) it *retires* native: from then on it runs hand-written equivalents (recursive
  doubling, ring, binomial) instead. A rank still waiting in a native operation when it learns
  of an older failure runs that operation's hand-written equivalent instead (no rank that
  failed ever posts a native operation again, so the one it waits in can never complete; every
  other rank either waits in it too, and learns the same, or has retired already). An abandoned
  native operation may still complete later between ranks that both abandoned it, so it never
  writes into the caller's arrays: it receives into a landing buffer of its own (copied out
  when it completes), which is then kept, with its request and send buffers, until MPI is done
  with it.
- **Check notes.** A native operation's signature check (:mod:`.agree`) is skipped by a rank
  whose signature is the one every rank agreed on last; a rank whose arguments changed checks
  instead, on another communicator, so the two would wait for each other forever. A check that
  has not finished within :data:`CHECK_PATIENCE` seconds, made while a signature was agreed,
  sends a *check note* (a notice of its own type, ``(call, check)``: the call number and how
  many checks its rank made before in that call) to every other rank; a rank that runs the
  same call's same check without checking it (:meth:`Guard.skip_check`) raises ``ValueError``
  when the note arrives or, if it came first, at the skip, and its notice ends the call on the
  checking ranks. With equal arguments every rank makes the same checks in the same order, so
  a note of a check that a rank skipped always means arguments that differ; notes of checks
  every rank made are ignored.
- **Incarnations.** A communicator freed and made again may get the same MPI context id, and
  a notice sent on the old one may still wait, unreceived, to be matched: call numbers start
  above every one this process used before (``_HIGH``), and a notice numbered below the
  guard's first call is dropped. The guard counts the notices it sends to and receives from
  each rank, so that its communicator is freed only once every notice sent on it has been
  received (``_runtime/release.py``), and none waits for the next communicator. The native and
  check duplicates, where ranks that retired native skipped an operation that another rank
  started, are never freed before exit (``_runtime/release.py``, step 4).

The running call is explicit: :meth:`Guard.run` names itself in its context's ``active``, and
the algorithms hand that guard to every message (:mod:`.p2p`), block and shared-memory round
they run. Outside a public call (algorithms called directly, as some benchmarks do) it is None,
and the helpers of :mod:`.p2p` make plain blocking calls.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from . import flight, job
from ..observe import OBSERVERS as _OBSERVED
from .workspace import forget

__all__ = ["CollectiveError", "RaisedEverywhere", "everywhere", "Guard", "native_call",
           "NOTICE_TAG", "live_guards", "argument_error", "mark_argument_error"]

NOTICE_TAG = 0
_NOTICE_BYTES = 1024
_HEAD = 5  # int64 words: seq, rank, type code, argument error (0 or 1), message length
_TYPES: tuple[type[BaseException], ...] = (TypeError, ValueError, TimeoutError)
#: a notice's type code that is no failure: a check note (module docstring)
_CHECKING = 255
#: Seconds a native operation's signature check waits before it sends check notes: a check
#: that every rank joins takes microseconds; one still waiting may wait for a rank that repeats.
CHECK_PATIENCE = 0.01


class CollectiveError(RuntimeError):
    """A collective failed on another rank with an error other than TypeError, ValueError or
    TimeoutError (whose type the other ranks keep); the message names the rank and its error."""

    __module__ = "collectives"  # public as collectives.CollectiveError


class RaisedEverywhere(Exception):
    """An error that every rank still in the call raises, not this rank's own: from another
    rank's notice, or reached by every rank together (the verdict of ``validate=True``, shm's
    "not on one node"). The guard sends no notice for it. Raised as a subclass of the type it
    reports (:func:`everywhere`), so ``except ValueError`` and the printed name stay the
    reported type's."""

    #: the rank whose error it reports (a notice), None when every rank reached it together
    origin: int | None = None


def mark_argument_error(exc: BaseException) -> None:
    """Mark ``exc`` as a bad argument that a call's checks found before it sent anything (the
    one path of a blocking call, :mod:`.blocking`, marks what its checks raise): its notice
    says so, and the crash hook (:mod:`.crash`) prints it without a flight-recorder dump,
    which could add nothing to its traceback."""
    try:
        exc.collectives_argument_error = True  # type: ignore[attr-defined]
    except AttributeError:  # pragma: no cover - an exception class with __slots__
        pass


def argument_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a bad argument found before any message (:func:`mark_argument_error`),
    on this rank or, through its notice, on another."""
    return bool(getattr(exc, "collectives_argument_error", False))


def _everywhere_class(kind: type[Exception]) -> type[RaisedEverywhere]:
    """``kind`` marked as raised everywhere; named and printed as ``kind`` itself."""
    return type(kind.__name__, (RaisedEverywhere, kind),
                {"__module__": kind.__module__, "__qualname__": kind.__qualname__,
                 "__doc__": f"{kind.__name__}, raised by every rank of the call."})


#: The class an error reported as each type is raised as (:class:`RaisedEverywhere`).
_EVERYWHERE: dict[type[Exception], type[RaisedEverywhere]] = {
    kind: _everywhere_class(kind) for kind in (*_TYPES, CollectiveError)}


def everywhere(kind: type[Exception], message: str, origin: int | None = None
               ) -> RaisedEverywhere:
    """The error ``kind(message)`` (TypeError, ValueError, TimeoutError or CollectiveError) as
    one that every rank raises: the guard sends no notice for it. ``origin``: the rank whose
    error it is, if one rank's."""
    error = _EVERYWHERE[kind](message)
    error.origin = origin
    return error


class _Retire(Exception):
    """Internal: a native operation will never complete (a rank failed in an earlier call)."""


_GUARDS: "weakref.WeakSet[Guard]" = weakref.WeakSet()
_ORDINALS: dict[tuple, int] = {}  # (members, thread name) -> guards made (Guard.ordinal)


def _span() -> int:
    ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    return min(int(ub) if ub else 32767, 1 << 30) - 1


_SPAN = _span()
#: Under a deadline, waits test their requests this many times before they nap _NAP seconds
#: between tests (and look at the clock).
_SPINS, _NAP = 1000, 50e-6
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def eager_tests() -> int:
    """How many times a wait tests its requests before it yields the processor between tests:
    :data:`EAGER_TESTS` when this node's ranks of the job (``MPI_LOCALNRANKS`` under MPICH,
    ``OMPI_COMM_WORLD_LOCAL_SIZE`` under Open MPI, else the world's size) have a core each,
    else 0. A yield is a system call, and a short operation finishes within a few tests; with
    more ranks than cores the rank waited for may need this very core, so the wait yields at
    once (docs/benchmarks/overhead.md, `algorithm="native"` against the bare call)."""
    local = os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    ranks = int(local) if local and local.isdigit() else MPI.COMM_WORLD.size
    return EAGER_TESTS if ranks <= (os.cpu_count() or 1) else 0


#: tests before the first yield when every rank has a core (:func:`eager_tests`)
EAGER_TESTS = 16
#: this process's: :data:`EAGER_TESTS` or 0
TESTS_BEFORE_YIELD = eager_tests()
#: above every call number a closed guard of this process used (see Guard.__init__)
_HIGH = [0]
#: notices dropped as an earlier incarnation's (tests account for the messages they leave)
DROPPED = [0]

_clock = flight.clock
_STARTED, _FINISHED = flight.STARTED, flight.FINISHED


def _world_ranks(comm: MPI.Comm) -> list[int]:
    """The ``COMM_WORLD`` ranks of ``comm``'s members, in its rank order (what the flight
    recorder's dumps name a communicator by; empty if MPI cannot say)."""
    try:
        group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
        try:
            return [int(r) for r in MPI.Group.Translate_ranks(group, list(range(comm.size)),
                                                              world)]
        finally:
            group.Free()
            world.Free()
    except MPI.Exception:  # pragma: no cover - a communicator MPI cannot translate
        return []


class Guard:
    """Sequence numbers, notices and guarded waits of one private communicator."""

    # slots: every call reads and writes a few of them (``run``), and more attributes than an
    # instance dictionary shares its keys for (30 in CPython) would make each access slower
    __slots__ = ("comm", "owner", "rank", "size", "seq", "first", "tag", "name", "call",
                 "deadline", "timeout", "retired", "later", "noted", "made", "skipped",
                 "skip_made", "dangling", "_outbox", "sent", "got", "_waiter", "_box", "_status",
                 "notice", "ring", "records", "nrecords", "waits", "members", "ordinal",
                 "__weakref__")

    def __init__(self, comm: MPI.Comm, owner: Any) -> None:
        self.comm = comm
        self.owner = owner  # the Context whose ``active`` names the running call
        self.rank = comm.rank
        self.size = comm.size
        # Call numbers start above any this process's guards used before, agreed by all ranks:
        # a communicator freed and made again may get the same MPI context id, and a message
        # left behind by a failed call on the old one must not match a call on the new one.
        # For the same reason the agreement is an MPI collective, which no point-to-point
        # message can match (mpi4py's allreduce of a Python object sends point-to-point
        # messages with tag 0, on a duplicate that may get a freed communicator's context id
        # and take a notice left queued there: MPI_ERR_TRUNCATE). The job's id rides along
        # (:mod:`.job`: the flight recorder's dumps go to a folder of the job's own).
        high = np.array([_HIGH[0], job.proposal()], dtype=np.int64)
        comm.Allreduce(MPI.IN_PLACE, high, op=MPI.MAX)
        job.agreed(comm, int(high[1]))
        self.seq = int(high[0]) - 1
        self.first = self.seq + 1  # a notice numbered below: from an earlier incarnation
        self.tag = 0
        self.name = ""
        self.call: Any = None  # the running call's checked arguments, for error messages
        self.deadline: float | None = None  # time.monotonic() past which the call times out
        self.timeout = 0.0
        self.retired = False
        self.later: dict[int, BaseException] = {}   # notices for calls this rank has not reached
        # check notes (module docstring): (call, check) noted by other ranks, and by this rank
        # (call, checks made in it) and the (call, check) it runs without checking
        self.noted: dict[tuple[int, int], int] = {}
        self.made = (0, 0)
        self.skipped, self.skip_made = -1, (0, 0)
        self.dangling: list[Any] = []               # requests (and their buffers) left behind
        self._outbox: list[Any] = []
        # notices sent to and received from each rank: a release exchanges them, so that no
        # notice is left queued when the communicator is freed (_runtime/release.py)
        self.sent = np.zeros(self.size, dtype=np.int64)
        self.got = np.zeros(self.size, dtype=np.int64)
        self._waiter = getattr(comm, "waiter", None)  # an engine communicator polls
        self._box = np.empty(_NOTICE_BYTES, dtype=np.uint8)
        self._status = MPI.Status()  # complete()'s, reused (a guard runs one call at a time)
        self.notice = comm.Irecv([self._box, MPI.BYTE], MPI.ANY_SOURCE, NOTICE_TAG)
        # -- flight recorder (collectives._runtime.flight): the last calls, for a dump
        self.ring = flight.new_ring()
        self.records = None if self.ring is None else self.ring.records
        self.nrecords = 0 if self.ring is None else self.ring.size
        self.waits: tuple[int, list[int]] | None = None  # (call number, peers) of the last wait
        self.members = _world_ranks(comm)
        # the dumps' name of the communicator: its members and its place among the guards over
        # the same ranks that this thread made (every rank makes them in the same order)
        key = (tuple(self.members), threading.current_thread().name)
        self.ordinal = _ORDINALS.get(key, 0)
        _ORDINALS[key] = self.ordinal + 1
        _GUARDS.add(self)

    # -- a call ----------------------------------------------------------------------------------
    def run(self, name: str, fn: Callable[..., Any], *args: Any,
            timeout: float | None = None, call: Any = None, what: tuple | None = None) -> Any:
        """``fn(*args)`` as call number ``seq + 1`` on this communicator (see the module), with a
        deadline ``timeout`` seconds from now if given (``Options.timeout``). ``call``: the
        checked call, if known yet (its ``src`` names the caller's array in a size mismatch).
        ``what``: the call's description for the flight recorder (:func:`.flight.describe`),
        if the caller made it once; else the checked call's, taken when the call ends."""
        seq = self.seq = self.seq + 1
        self.tag = 1 + seq % _SPAN
        self.name = name
        self.call = call
        self.deadline = None
        if timeout is not None:
            self.set_timeout(timeout)
        # -- flight recorder: the preallocated record of this call number, four stores
        records = self.records
        if records is not None:
            rec = records[seq % self.nrecords]
            rec.seq, rec.kind = seq, name
            rec.what, rec.state = what, _STARTED
        # --
        observers = _OBSERVED.call  # -- observers (observe.py: the timeline): off, this test only
        t0 = _clock() if observers else 0.0
        owner = self.owner
        outer, owner.active = owner.active, self
        try:
            result = fn(*args)
        except BaseException as exc:
            if records is not None or observers:  # -- flight recorder, observers
                flight.failed(rec if records is not None else None, exc, what, self.call,
                              observers, name, t0, seq)
            if not isinstance(exc, RaisedEverywhere):  # this rank's own: tell the others
                self._notify(exc)
                try:  # for the crash hook: which call it was (see first_reporter)
                    exc.collectives_call = (self, self.seq)
                except AttributeError:
                    pass
            raise
        finally:
            owner.active = outer
            call, self.call = self.call, None  # the call's arrays are the caller's again
        if records is not None:  # -- flight recorder: the record's end
            rec.state, rec.t1 = _FINISHED, _clock()
            if what is None and call is not None:
                rec.what = flight.describe(call)
        if observers:  # -- observers
            flight.tell_finished(rec if records is not None else None, what, call, observers,
                                 name, t0, seq)
        return result

    def set_timeout(self, timeout: float | None) -> None:
        """Give the running call a deadline ``timeout`` seconds from now (``Options.timeout``;
        None: none): its waits then raise TimeoutError, on this rank and, through its notice, on
        every rank still in the call."""
        if timeout is not None:
            self.timeout, self.deadline = timeout, time.monotonic() + timeout

    def _notify(self, exc: BaseException) -> None:
        """Tell every other rank that this rank's current call failed; retire native."""
        self.retired = True
        self._outbox = [r for r in self._outbox if not r.Test()]
        code = next((i for i, t in enumerate(_TYPES) if isinstance(exc, t)), len(_TYPES))
        text = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
        text = text[:_NOTICE_BYTES - 8 * _HEAD]
        buf = np.zeros(_NOTICE_BYTES, dtype=np.uint8)
        buf[:8 * _HEAD].view(np.int64)[:] = (self.seq, self.rank, code,
                                             int(argument_error(exc)), len(text))
        buf[8 * _HEAD:8 * _HEAD + len(text)] = np.frombuffer(text, dtype=np.uint8)
        for r in range(self.size):
            if r != self.rank:
                self._outbox.append(self.comm.Isend([buf, MPI.BYTE], r, NOTICE_TAG))
                self.sent[r] += 1

    def begin_check(self) -> int:
        """A signature check of the running call begins on this rank: its index among the
        call's checks (check notes, module docstring)."""
        seq, k = self.made
        k = k if seq == self.seq else 0
        self.made = (self.seq, k + 1)
        if self.noted:  # notes of calls before this one are stale
            self.noted = {key: r for key, r in self.noted.items() if key[0] >= self.seq}
        return k

    def skip_check(self) -> None:
        """The running call's next native operation runs without a signature check (its
        signature is the one agreed on last): raise if another rank noted that it checks it.
        Two stores on a native repeat; the check's index is worked out only for a note."""
        self.skipped, self.skip_made = self.seq, self.made
        if self.noted:
            rank = self.noted.get(self._skipped())
            self.noted = {key: r for key, r in self.noted.items() if key[0] >= self.seq}
            if rank is not None:
                raise self._changed(rank)

    def _skipped(self) -> tuple[int, int]:
        """(call, check index) of the native operation this rank runs without a check."""
        seq, k = self.skip_made
        return self.skipped, (k if seq == self.skipped else 0)

    def tell_checking(self, k: int) -> None:
        """Send a check note for this call's check number ``k`` to every other rank."""
        self._outbox = [r for r in self._outbox if not r.Test()]
        buf = np.zeros(8 * _HEAD, dtype=np.uint8)
        buf.view(np.int64)[:] = (self.seq, self.rank, _CHECKING, k, 0)
        for r in range(self.size):
            if r != self.rank:
                self._outbox.append(self.comm.Isend([buf, MPI.BYTE], r, NOTICE_TAG))
                self.sent[r] += 1

    def _changed(self, rank: int) -> ValueError:
        """The error of a rank that repeats the agreed signature while ``rank`` checks another."""
        return ValueError(
            f"{self.name}: count, dtype or op differs across ranks: rank {rank} passes other "
            f"arguments than the ones every rank agreed on last, which rank {self.rank} passes "
            "again (the same arguments on every rank)")

    def take_outbox(self) -> list[Any]:
        """This rank's notice sends still in flight (a release keeps them until they complete)."""
        outbox, self._outbox = self._outbox, []
        return outbox

    def _count(self) -> tuple[int, int]:
        """The call number and rank of the notice in ``_box``, counted as received from that
        rank if it is one of this communicator's (not an earlier incarnation's)."""
        seq, rank = (int(v) for v in self._box[:16].view(np.int64))
        if seq >= self.first and 0 <= rank < self.size:
            self.got[rank] += 1
        return seq, rank

    def first_reporter(self, seq: int, wait_s: float) -> int | None:
        """For the crash hook of a rank whose own error ended call ``seq``: the lowest rank
        that failed in the same call on its own (two ranks that find one size mismatch both
        do; three ranks may), as their notices say within ``wait_s`` seconds, else None. The
        lowest, not the first to arrive: a rank that finds a still lower one prints one line,
        not its traceback, so only the lowest prints in full. Reads notices without keeping
        them: the job is ending."""
        deadline = time.monotonic() + wait_s
        lowest = None
        while self.rank and lowest != 0:
            if self.notice.Test():
                found, rank = self._count()
                if int(self._box[16:24].view(np.int64)[0]) == _CHECKING:
                    found = -1  # a check note reports no failure
                if found == seq and rank < self.rank and (lowest is None or rank < lowest):
                    lowest = rank
                self._box = np.empty(_NOTICE_BYTES, dtype=np.uint8)
                self.notice = self.comm.Irecv([self._box, MPI.BYTE], MPI.ANY_SOURCE, NOTICE_TAG)
                continue
            if time.monotonic() > deadline:
                break
            time.sleep(1e-3)
        return lowest

    def _read_notice(self) -> bool:
        """Handle the notice that arrived: raise it (current call), keep it (a later call) or
        just record the failure (an earlier call: returns True); post the next notice receive.
        A notice from an earlier incarnation of the communicator is dropped."""
        seq, rank = self._count()
        code, arguments, n = (int(v) for v in self._box[16:8 * _HEAD].view(np.int64))
        text = bytes(self._box[8 * _HEAD:8 * _HEAD + n]).decode("utf-8", "replace")
        self._box = np.empty(_NOTICE_BYTES, dtype=np.uint8)
        self.notice = self.comm.Irecv([self._box, MPI.BYTE], MPI.ANY_SOURCE, NOTICE_TAG)
        if seq < self.first:
            DROPPED[0] += 1
            return False
        if code == _CHECKING:  # a check note (``arguments``: the check's index in its call)
            if seq == self.skipped and (seq, arguments) == self._skipped():
                raise self._changed(rank)
            if seq >= self.seq:
                self.noted[seq, arguments] = rank
            return False
        self.retired = True
        if seq < self.seq:
            return True
        kind = _TYPES[code] if code < len(_TYPES) else CollectiveError
        error = everywhere(kind, f"{self.name} #{seq} failed on rank {rank}: {text}", rank)
        if arguments:
            mark_argument_error(error)
        if seq > self.seq:
            self.later[seq] = error
            return False
        if kind is TimeoutError:
            flight.auto_dump("timeout", error)  # -- flight recorder
        raise error

    # -- waits -------------------------------------------------------------------------------
    def complete(self, reqs: list[Any], expect: list[int | None], peers: list[int],
                 native: bool = False, keep: tuple = ()) -> None:
        """Wait for every request in ``reqs`` (receives expecting ``expect[i]`` bytes, None for
        sends; ``native``: one collective), or raise what a notice says (module docstring).
        The observers of ``message`` (observe.py: the timeline) hear of the round at its end."""
        observers = _OBSERVED.message  # -- observers: off, this and the test at the end
        t0 = _clock() if observers else 0.0
        try:
            if self.later and self.seq in self.later:
                self._abandon(reqs, expect, keep)
                raise self.later.pop(self.seq)
            self.waits = (self.seq, peers)  # flight recorder: whom this call waits for
            todo = [self.notice] + reqs  # first: a notice that has arrived is handled first
            left = len(reqs)
            status = self._status
            while left:
                try:
                    i = self._waitany(todo, status, native)
                except TimeoutError:
                    self._abandon(todo[1:], expect, keep)
                    raise
                except MPI.Exception as exc:
                    self._abandon(todo[1:], expect, keep)
                    if exc.Get_error_class() != MPI.ERR_TRUNCATE:
                        raise
                    peer = next((p for p, e in zip(peers, expect) if e is not None), None)
                    raise self._mismatch(max(e or 0 for e in expect), peer, None) from None
                if i == 0:
                    try:
                        older = self._read_notice()
                    except BaseException:
                        self._abandon(todo[1:], expect, keep)
                        raise
                    if older and native:  # it can never finish: run the fallback instead
                        raise _Retire()
                    todo[0] = self.notice
                    continue
                left -= 1
                want = expect[i - 1]
                if want is not None and status.Get_count(MPI.BYTE) != want:
                    self._abandon(todo[1:], expect, keep)
                    raise self._mismatch(want, peers[i - 1], status.Get_count(MPI.BYTE))
        finally:
            if observers:
                t1 = _clock()
                for observe in observers:
                    observe(native, peers, expect, t0, t1)

    def _mismatch(self, want: int, peer: int | None, got: int | None) -> ValueError:
        """The error of a receive of another size than expected: it names this rank's array
        (the user's count and dtype, not only the algorithm's block) and the rank that sent."""
        src = getattr(self.call, "src", None)
        mine = "" if src is None else \
            f" has {src.size} elements of {src.dtype} ({src.nbytes} bytes) and"
        sender = "another rank" if peer is None else f"rank {peer}"
        received = "a longer message" if got is None else f"{got}"
        return ValueError(f"{self.name}: count or dtype differs across ranks: rank {self.rank}"
                          f"{mine} expected a block of {want} bytes from {sender}, received "
                          f"{received}: {sender}'s array has another count or dtype")

    def _waitany(self, todo: list[Any], status: MPI.Status, native: bool = False) -> int:
        if self._waiter is not None:  # an engine's (naps short for MPI's own collectives)
            return self._waiter.wait_any(todo, status, native)
        testany = MPI.Request.Testany
        if self.deadline is None:
            # MPI_Waitany itself spins without giving up the processor: with more ranks than
            # cores each wait costs a scheduler tick, while testing and yielding between tests
            # lets the rank being waited for run (docs/benchmarks.md, "Numbers behind the code");
            # with a core per rank, a few tests first (eager_tests)
            for _ in range(TESTS_BEFORE_YIELD):
                i, done = testany(todo, status)
                if done:
                    return i
            while True:
                i, done = testany(todo, status)
                if done:
                    return i
                _yield()
        spins = 0  # a deadline: test, yielding the processor between tests, until it passes
        while True:
            i, done = testany(todo, status)
            if done:
                return i
            spins += 1
            if spins > _SPINS:
                time.sleep(_NAP)
                if time.monotonic() > self.deadline:
                    raise self.timed_out()
            else:
                time.sleep(0)

    def timed_out(self) -> TimeoutError:
        """The error of a call that passed its deadline (``Options.timeout``); the flight
        recorder dumps (:mod:`collectives.flight_recorder`)."""
        error = TimeoutError(f"{self.name} #{self.seq} timed out after {self.timeout:g} s on "
                             f"rank {self.rank} (Options.timeout): a rank has not made the call, "
                             "or is stuck in an earlier one")
        flight.auto_dump("timeout", error)  # -- flight recorder
        return error

    def poll(self) -> None:
        """For waits that are not on MPI requests (the shared window's counters): handle a
        notice that has arrived (one for this call raises, also one kept from before this call
        began: a rank that raced ahead failed it while this one was finishing the last call),
        and raise TimeoutError once the call's deadline has passed."""
        if self.later and self.seq in self.later:
            raise self.later.pop(self.seq)
        if self.notice.Test():
            self._read_notice()
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise self.timed_out()
        if self._waiter is not None and self._waiter.alarm is not None:
            self._waiter.check_alarm()  # an engine operation's stall warning (engine/comm.py)

    def _abandon(self, reqs: list[Any], expect: list[int | None], keep: tuple = ()) -> None:
        """Give up on the requests of a failed call: cancel the receives (those that expect a
        size; a send or a collective cannot be withdrawn safely) and keep the others referenced,
        with the buffers in ``keep``, until they complete, so that their buffers outlive them."""
        for req, want in zip(reqs, expect):
            if req == MPI.REQUEST_NULL:
                continue
            if want is not None:
                req.Cancel()
                try:
                    req.Wait()
                except MPI.Exception:  # it had matched a message of the wrong size: discarded
                    pass
            else:
                self.dangling.append((req, keep))
        self.dangling = [d for d in self.dangling if not d[0].Test()]

    def native(self, start: Callable[[], Any], fallback: Callable[[], None],
               keep: tuple = (), started: list[int] | None = None, which: int = 0) -> bool:
        """Run a native operation (``start()`` returns its request) and return True, or run
        ``fallback()`` and return False once native is retired or turns out to be unable to
        finish (see the module docstring). ``keep``: the operation's buffers, kept alive with
        its request if it is abandoned (MPI may still read and write them). ``started``: the
        context's counts of operations started (``Context.started``), of which entry ``which``
        counts this one once MPI has started it (a release compares them across ranks:
        ``_runtime/release.py``)."""
        if self.retired:
            fallback()
            return False
        req = start()
        if started is not None:
            started[which] += 1
        try:
            self.complete([req], [None], [-1], native=True, keep=keep)
        except _Retire:
            self._abandon([req], [None], keep)
            fallback()
            return False
        return True

    def close(self) -> None:
        """Withdraw the posted notice receive (the communicator is about to be released:
        ``_runtime/release.py``); a notice it had received already is counted."""
        _HIGH[0] = max(_HIGH[0], self.seq + 2)
        notice, self.notice = self.notice, MPI.REQUEST_NULL
        if notice != MPI.REQUEST_NULL and not MPI.Is_finalized():
            notice.Cancel()
            status = MPI.Status()
            notice.Wait(status)
            if not status.Is_cancelled():
                self._count()
        _GUARDS.discard(self)
        ring, self.ring, self.records = self.ring, None, None
        flight.release_ring(ring)  # the next communicator's recorder reuses it


def live_guards() -> list[Guard]:
    """Every guard not closed (the flight recorder's dumps read their records)."""
    return list(_GUARDS)


def native_call(ctx: Any, name: str, args: tuple, fallback: Callable[[], None],
                landing: Any = None) -> bool:
    """The MPI library's collective ``<name>(*args)`` on the context ``ctx``: blocking on
    ``ctx.comm`` outside a public call; inside one, its non-blocking form (``Iallreduce`` for
    ``Allreduce``) on ``ctx.native_comm`` (a duplicate of its own, so that an operation a failure
    left behind can never pair with another collective) under the call's guard, or
    ``fallback()`` (a hand-written equivalent) once native is retired.

    ``landing``: ``(name, buffer)`` of the :func:`~.workspace.scratch` buffer that ``args``
    receive into instead of the caller's array, under a guard (see the module docstring). True:
    the native operation ran, and the caller copies the landing buffer out; False: ``fallback()``
    ran (and wrote the caller's array itself); an abandoned landing buffer is never handed out
    again."""
    guard = ctx.active
    if guard is None:
        getattr(ctx.comm, name)(*args)
        return True
    ran = False
    try:
        start = getattr(ctx.native_comm, _NONBLOCKING[name])
        ran = guard.native(lambda: start(*args), fallback, (args, landing), ctx.started, 0)
    finally:
        if not ran and landing is not None:
            forget(*landing)
    return ran


#: the non-blocking form of each MPI collective that :func:`native_call` runs under a guard
_NONBLOCKING = {"Allreduce": "Iallreduce", "Reduce_scatter": "Ireduce_scatter",
                "Allgatherv": "Iallgatherv", "Bcast": "Ibcast", "Reduce": "Ireduce",
                "Alltoallv": "Ialltoallv", "Barrier": "Ibarrier", "Gatherv": "Igatherv",
                "Scatterv": "Iscatterv"}


@atexit.register
def _close_all() -> None:  # a pending receive at MPI_Finalize makes some transports warn
    for guard in list(_GUARDS):
        try:
            guard.close()
        except MPI.Exception:  # pragma: no cover - MPI already finalizing
            pass
