"""Point-to-point messages: ``send``, ``recv``, ``sendrecv``, ``isend``, ``irecv``, ``send_init``,
``recv_init``.

The conventions are mpi4py's buffer methods (``Comm.Send``, ``Comm.Recv``, ``Comm.Sendrecv``,
``Comm.Isend``, ``Comm.Irecv``): the caller's communicator, a rank, a tag, ``MPI.ANY_SOURCE``,
``MPI.ANY_TAG`` and ``MPI.PROC_NULL``; and the conventions of this library's calls: any array the
collectives accept (NumPy, CuPy, PyTorch tensors, every dtype of ``SUPPORTED_DTYPES`` and
bfloat16), checked before any message, and ``Options.timeout``.

**The type check: the dtype travels in the tag, the count is MPI's own.** A message of ``x`` with
the caller's tag ``t`` goes out on the caller's communicator with the tag ``t * CODES + code``,
``code`` the dtype's entry in :data:`DTYPE_CODES`; the payload is ``x``'s bytes, alone (no header,
no copy, no second message). A receive into ``out`` probes for a message of its source and of
the tag with ``out``'s own code (``MPI_Improbe``, a matched probe: the message is taken from MPI's
queue, not yet received), reads its size from the status, and receives it into ``out`` only if it
is exactly ``out.nbytes``. A large receive (:data:`PREPOST_BYTES`) that runs alongside sends
(``sendrecv``, ``irecv``) is posted into ``out`` at once instead, where the communicator returns
MPI's errors (mpi4py's default): a large message that meets no posted receive while both ranks
send is slow to take (docs/pt2pt.md, "Cost"). So:

- a message of ``out``'s dtype but another count is received into a scratch buffer (its sender
  completes) and raises ``ValueError`` naming both sides; ``out`` is left as it was. A posted
  receive gets a longer message as MPI's truncation error instead (``ValueError`` too; ``out``'s
  contents are then undefined) and a shorter one as a short count;
- a message of another dtype never matches. While it waits, the receive looks for one every
  :data:`SCAN_S` seconds: the first message waiting from the source, whatever its tag
  (``MPI_Iprobe`` with ``MPI_ANY_TAG``), and when that one has another tag, a probe of each other
  code of the caller's tag. One it finds is received into a scratch buffer (a posted receive is
  withdrawn first) and raises ``ValueError`` with the sender's count and dtype;
- ``MPI.ANY_TAG`` takes the first message from the source whatever its tag (MPI's order), and
  checks its code and size the same way.

So a mismatch is a clear error on the receiver, never a silently truncated message or bytes read as
another dtype, and the sender never waits for a receive that will not come. Matching on the
dtype makes it part of the envelope: a float32 receive posted while a float64 message of the
same tag is in flight behind messages of other tags may take a later float32 message first
(the float64 one is reported at the next look if it is still there). MPI calls a receive whose
type differs from its send erroneous; here it raises. A header carrying count and dtype costs
a second message or a copy, each 1.5-4x a bare ``Send``/``Recv`` at 8 B to 64 KiB in the
measurements of docs/pt2pt.md, and was not chosen. Caller tags run from 0 to
``MPI.TAG_UB // CODES - 1`` (2**25 - 1 under MPICH; the 32767 that MPI promises always fit).

**Failure semantics.** Point-to-point is not collective: the guard's call numbers
(``_runtime/guard.py``) count collective calls and stay out of it, and so do its notices (a rank
that fails before sending cannot know who waits). Messages go on the caller's communicator
itself (no private duplicate: making one is collective), where the library's collectives never
send anything (they run on a private duplicate); they could meet only the caller's own mpi4py
messages of the same tag. Every wait tests, yielding the processor between tests as the guard's
waits do, and with ``Options.timeout`` raises ``TimeoutError`` once it has waited that long. A
receive withdraws its posted receive, if it has one (``MPI_Cancel``); a send tries
``MPI_Cancel``, and one MPI cannot withdraw (MPICH's) stays referenced, with its buffer, and is
delivered if a matching receive comes later. A non-blocking request's ``wait()`` that times out
leaves it in flight (``wait()`` may be called again). Without a timeout a wait is as long as
MPI's, and a blocking send is ``MPI_Send`` itself.

**Cost.** A repeated blocking ``send``/``recv`` is found in the one cache of repeats, tells
the observers its start and end in line, and a ``recv`` probes, checks and receives in one
frame (:meth:`_Recv.transfer`): from MPI's rendezvous size (8 KiB under MPICH 5) a send waits
for its receive, so each rank's Python between two messages of an exchange is on its critical
path, not only the sender's before ``MPI_Send`` (docs/benchmarks/alltoall.md, "send/recv").

One-rank communicators, ``MPI.PROC_NULL`` and empty arrays need no special case: MPI handles
them (a message to oneself needs ``sendrecv`` or the non-blocking forms, as in MPI).

**Observed.** Each message tells the observers of ``pt2pt`` (``observe.py``) when it starts
and when it ends (:func:`_observed`; a request's from its posting to its completion): the
flight recorder keeps it (its side, peer, tag, bytes and state) and the timeline draws it. A
wait that times out asks for the flight recorder's dump (``flight.auto_dump``), as a
collective's does. With nobody observing, a call pays one test of an empty tuple.
"""

from __future__ import annotations

import os
import time
from operator import attrgetter
from typing import Any

import numpy as np
from compress.arrays import is_numpy
from mpi4py import MPI

from .._runtime import device as _device
from .._runtime import flight
from .._runtime.arrays import check_input, flat, unowned, writeable
from .._runtime.blocking import prepare_local, run_local
from .._runtime.repeats import REPEATS, Repeat, kind_of
from .._runtime.validate import resolve
from .._runtime.guard import TESTS_BEFORE_YIELD
from ..observe import OBSERVERS as _OBSERVED
from ..options import Options

__all__ = ["send", "recv", "sendrecv", "isend", "irecv", "send_init", "recv_init", "P2PRequest",
           "P2PPlan", "DTYPE_CODES", "CODES", "SCAN_S", "dtype_name"]

#: The code of each dtype in a message's tag (``tag * CODES + code``), by name.
DTYPE_CODES: dict[str, int] = {
    "float16": 0, "float32": 1, "float64": 2, "bfloat16": 3,
    "int8": 4, "int16": 5, "int32": 6, "int64": 7,
    "uint8": 8, "uint16": 9, "uint32": 10, "uint64": 11,
}
_NAMES = {code: name for name, code in DTYPE_CODES.items()}
#: the same table by dtype object (bfloat16: the one supported dtype not in it)
_BY_DTYPE = {np.dtype(name): code for name, code in DTYPE_CODES.items() if name != "bfloat16"}
#: Codes per caller tag: room for the table and a few more dtypes.
CODES = 16
#: Seconds between a waiting receive's looks for a message of another dtype (a request's
#: first look comes after its first :data:`_SCAN_AFTER` tests, a blocking receive's
#: ``SCAN_S`` after its first yield); a wait reads the clock once every 16 tests.
SCAN_S = 1e-3
_SCAN_AFTER = 16
_LOOK_EVERY = 15  # (tests & _LOOK_EVERY == 0: a test that reads the clock)
#: From this many bytes a ``sendrecv``'s or ``irecv``'s receive of a given tag is posted straight
#: into ``out`` before its message comes, where the communicator returns MPI's errors (on a
#: loaded machine a large message exchanged both ways at once was much slower received after
#: a probe: docs/pt2pt.md).
PREPOST_BYTES = 64 << 10
#: Under a deadline, seconds a wait naps between tests once it has tested a thousand times.
_NAP_S = 50e-6
_SPINS = 1000
#: A blocking receive's probes back to back before it yields the processor between them
_EAGER = range(TESTS_BEFORE_YIELD)
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
#: Sends that timed out and that MPI could not withdraw, with their buffers, until they complete.
_DANGLING: list[tuple[Any, Any]] = []
_clock = flight.clock


def _tag_limit() -> int:
    """The largest caller tag (``MPI.TAG_UB // CODES - 1``)."""
    if not _LIMIT:
        _LIMIT.append(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) // CODES - 1)
    return _LIMIT[0]


_LIMIT: list[int] = []


# -- argument checks -----------------------------------------------------------------------------
def _array(x: object, what: str, kind: str) -> tuple[Any, int]:
    """``x`` checked (``_runtime/arrays.check_input``), and its dtype's code."""
    try:
        a = check_input(x, what)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{kind}: {exc}") from None
    code = _BY_DTYPE.get(a.dtype)
    return a, DTYPE_CODES["bfloat16"] if code is None else code


def _peer(comm: MPI.Comm, rank: object, what: str, kind: str, any_source: bool) -> int:
    """``rank`` checked: a rank of ``comm``, ``MPI.PROC_NULL`` or (receives) ``MPI.ANY_SOURCE``."""
    if type(rank) is int and 0 <= rank < comm.size:
        return rank
    if isinstance(rank, (int, np.integer)) and not isinstance(rank, bool):
        rank = int(rank)
        if 0 <= rank < comm.size or rank == MPI.PROC_NULL or \
                (any_source and rank == MPI.ANY_SOURCE):
            return rank
    also = ", MPI.PROC_NULL" + (" or MPI.ANY_SOURCE" if any_source else "")
    raise ValueError(f"{kind}: {what} must be a rank of the communicator (0 to {comm.size - 1})"
                     f"{also}, got {rank!r}")


def _tag(tag: object, what: str, kind: str, any_tag: bool) -> int:
    """``tag`` checked: 0 to :func:`_tag_limit`, or (receives) ``MPI.ANY_TAG``."""
    if type(tag) is int and 0 <= tag <= (_LIMIT[0] if _LIMIT else _tag_limit()):
        return tag
    if isinstance(tag, (int, np.integer)) and not isinstance(tag, bool):
        tag = int(tag)
        if 0 <= tag <= _tag_limit() or (any_tag and tag == MPI.ANY_TAG):
            return tag
    also = " or MPI.ANY_TAG" if any_tag else ""
    raise ValueError(f"{kind}: {what} must be an int from 0 to {_tag_limit()} (MPI.TAG_UB // "
                     f"{CODES}: the dtype travels in the tag){also}, got {tag!r}")


def dtype_name(code: int) -> str:
    """The name of the dtype of code ``code`` (:data:`DTYPE_CODES`)."""
    return _NAMES.get(code, f"dtype code {code}")


def _describe(nbytes: int, code: int) -> str:
    name = _NAMES.get(code, f"dtype code {code}")
    size = np.dtype(np.uint16 if name == "bfloat16" else name).itemsize if code in _NAMES else 1
    return f"{nbytes // size} elements of {name} ({nbytes} bytes)"


# -- the two halves of a message -----------------------------------------------------------------
class _Send:
    """One send in flight: ``test()`` until True, ``abandon()`` after a timeout."""

    __slots__ = ("comm", "buf", "spec", "dest", "tag", "wire", "req", "code", "nbytes",
                 "envelope", "seq")
    side = "send"

    def __init__(self, comm: MPI.Comm, a: Any, code: int, dest: int, tag: int,
                 staging: str | None) -> None:
        self.comm, self.dest, self.tag, self.wire = comm, dest, tag, tag * CODES + code
        self.code, self.nbytes = code, a.nbytes
        #: what an observer keeps of the message, made once; ``seq``: its number there
        self.envelope, self.seq = ("send", comm, dest, tag, a.nbytes, code), 0
        buf = a if a.ndim == 1 and type(a) is np.ndarray and a.dtype.isbuiltin else flat(a)
        if not is_numpy(buf):  # device: CUDA-aware, or a host copy
            buf = _device.to_mpi(buf, staging) if staging else buf.view(np.uint8).get()
        self.buf, self.spec = buf, [buf, MPI.BYTE]
        self.req = None

    def start(self) -> "_Send":
        self.req = self.comm.Isend(self.spec, self.dest, self.wire)
        return self

    def transfer(self, timeout: float | None) -> None:
        """The whole of a blocking send (``send``): ``MPI_Send`` itself without a timeout,
        else ``MPI_Isend`` and tests under the deadline (:func:`_complete`)."""
        if timeout is None:
            self.comm.Send(self.spec, self.dest, self.wire)
        else:
            _complete([self.start()], "send", timeout)

    def test(self) -> bool:
        return self.req.Test()

    def abandon(self) -> None:
        req, self.req = self.req, MPI.REQUEST_NULL
        try:
            req.Cancel()
        except MPI.Exception:  # pragma: no cover - a library that cannot cancel sends
            pass
        if not req.Test():
            _DANGLING.append((req, self.buf))
        _DANGLING[:] = [d for d in _DANGLING if not d[0].Test()]

    def waiting(self) -> str:
        return f"send to rank {self.dest} (tag {self.tag}): rank {self.dest} has not received it"

    @property
    def peer(self) -> int:
        return self.dest

    @property
    def dtype(self) -> str:
        return dtype_name(self.code)


class _Recv:
    """One receive in flight (module docstring): ``test()`` until True, raising ValueError on
    a message of another size or dtype; ``abandon()`` after a timeout."""

    __slots__ = ("comm", "kind", "out", "flat", "target", "spec", "code", "source", "tag",
                 "probe_tag", "null", "status", "req", "tests", "next_scan", "result_status",
                 "blocking", "posted", "envelope", "seq", "nbytes")
    side = "recv"

    def __init__(self, comm: MPI.Comm, kind: str, a: Any, code: int, source: int, tag: int,
                 staging: str | None, status: MPI.Status | None) -> None:
        self.comm, self.kind, self.out, self.code = comm, kind, a, code
        self.source, self.tag, self.result_status = source, tag, status
        self.nbytes = a.nbytes
        self.envelope, self.seq = ("recv", comm, source, tag, a.nbytes, code), 0  # as _Send's
        target = self.flat = flat(a)
        if not is_numpy(target):  # device: CUDA-aware, or received on the host and copied
            target = _device.from_mpi(target, staging) if staging else \
                np.empty(a.nbytes, np.uint8)
        self.target, self.spec = target, [target, MPI.BYTE]
        self.null = source == MPI.PROC_NULL
        self.probe_tag = tag if tag == MPI.ANY_TAG else tag * CODES + code
        self.status = MPI.Status()
        self.req = None
        self.tests = 0
        self.next_scan = 0.0
        #: a blocking call's receive: once matched, received at once (``MPI_Mrecv``); a
        #: request's (no staging slot of its own) is received by ``MPI_Imrecv`` and tested
        self.blocking = staging is not None
        self.posted = False

    def start(self, prepost: bool = True) -> "_Recv":
        """Post the receive straight into ``out`` (if ``prepost``: a large one,
        :data:`PREPOST_BYTES`, or one from this rank itself, whose send MPI completes only once
        a receive takes it: ``irecv`` then ``isend(...).wait()`` to oneself), or nothing before
        the message has come (``test`` probes for it)."""
        self.req, self.posted, self.tests, self.next_scan = None, False, 0, 0.0
        if prepost and (self.out.nbytes >= PREPOST_BYTES or self.source == self.comm.rank) \
                and self.tag != MPI.ANY_TAG and self.source != MPI.PROC_NULL and \
                _returns_errors(self.comm):
            self.posted = True
            self.req = self.comm.Irecv(self.spec, self.source, self.probe_tag)
        return self

    def test(self) -> bool:
        """Probe for this receive's message (``MPI_Improbe``, which takes it from MPI's queue
        without receiving it); once there, check its size and dtype, then receive it. Before
        that, look for a message of another dtype now and then (``_scan``)."""
        if self.posted:
            return self._test_posted()
        if self.req is not None:
            return self.req.Test() and self._landed()  # matched, being received (irecv)
        if self.null:
            self.status.source, self.status.tag = MPI.PROC_NULL, MPI.ANY_TAG
            return self._landed()
        status = self.status
        msg = self.comm.Improbe(self.source, self.probe_tag, status)
        if msg is None:
            self.tests += 1
            if self.tests >= _SCAN_AFTER and not self.tests & _LOOK_EVERY and \
                    self.tag != MPI.ANY_TAG:
                now = time.monotonic()
                if now >= self.next_scan:
                    self.next_scan = now + SCAN_S
                    self._scan()
            return False
        if status.tag % CODES != self.code or status.Get_count(MPI.BYTE) != self.nbytes:
            self._drain(msg)  # raises
        if self.blocking:  # a matched message: its sender is sending it, the wait is short
            msg.Recv(self.spec)
            return self._landed()
        self.req = msg.Irecv(self.spec)
        return self.req.Test() and self._landed()

    def transfer(self, timeout: float | None) -> None:
        """The whole of a blocking receive (``recv``): probe until the message is there
        (:meth:`_poll`), check its size and dtype, receive it into ``out`` (``MPI_Mrecv``):
        probed, then received, so that any mismatch leaves ``out`` as it was (a receive posted
        into ``out`` first would let a message of another count land in it; its cost:
        docs/benchmarks/alltoall.md, "send/recv").
        The same steps as :meth:`test`, in one frame: after the message has come, its
        receiver's Python is on the critical path of every exchange."""
        if self.null:
            self.status.source, self.status.tag = MPI.PROC_NULL, MPI.ANY_TAG
            self._landed()
            return
        status = self.status
        msg = self.comm.Improbe(self.source, self.probe_tag, status)
        if msg is None:
            msg = self._poll(timeout)
        if status.tag % CODES != self.code or status.Get_count(MPI.BYTE) != self.nbytes:
            self._drain(msg)  # raises
        msg.Recv(self.spec)
        if self.target is not self.flat or self.result_status is not None:
            self._landed()

    def _poll(self, timeout: float | None) -> Any:
        """Probe for this receive's message until it comes, and return it (matched): the
        first :data:`TESTS_BEFORE_YIELD` probes back to back, then one per yield of the
        processor; a look for a message of another dtype (:meth:`_scan`) every
        :data:`SCAN_S` seconds; with ``timeout``, past :data:`_SPINS` probes a nap between
        them and TimeoutError once that many seconds have passed."""
        improbe, source, tag, status = self.comm.Improbe, self.source, self.probe_tag, \
            self.status
        for _ in _EAGER:
            msg = improbe(source, tag, status)
            if msg is not None:
                return msg
        scans = self.tag != MPI.ANY_TAG
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        next_scan, spins = now + SCAN_S, 0
        while True:
            spins += 1
            if deadline is None or spins <= _SPINS:
                _yield()
            else:
                time.sleep(_NAP_S)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.kind}: timed out after {timeout:g} s "
                                       f"(Options.timeout): {self.waiting()}")
            msg = improbe(source, tag, status)
            if msg is not None:
                return msg
            if scans and not spins & _LOOK_EVERY:
                now = time.monotonic()
                if now >= next_scan:
                    next_scan = now + SCAN_S
                    self._scan()

    def _test_posted(self) -> bool:
        """A receive posted into ``out``: a longer message is MPI's truncation error, a
        shorter one a count below ``out.nbytes``; one of another dtype is found by a look."""
        try:
            done = self.req.Test(self.status)
        except MPI.Exception as exc:
            if exc.Get_error_class() != MPI.ERR_TRUNCATE:
                raise
            self.req = MPI.REQUEST_NULL
            raise self._mismatch(None, self.code, None) from None
        if done:
            return self._landed()
        self.tests += 1
        if self.tests >= _SCAN_AFTER and not self.tests & _LOOK_EVERY:
            now = time.monotonic()
            if now >= self.next_scan:
                self.next_scan = now + SCAN_S
                self._scan()
        return False

    def _scan(self) -> None:
        """Look for a message of the same source and tag but another dtype: receive it into a
        scratch buffer (its sender completes) and raise. The first message waiting from the
        source, whatever its tag, is looked at first: when it has this tag, it is the earliest
        one (MPI's order); behind messages of other tags, each other code is probed."""
        base, probe = self.tag * CODES, MPI.Status()
        if not self.comm.Iprobe(self.source, MPI.ANY_TAG, probe):
            return  # nothing waiting
        if probe.tag // CODES == self.tag:
            codes = [probe.tag % CODES]
            source = probe.source  # (MPI.ANY_SOURCE: the rank whose message it is)
        else:
            codes, source = [c for c in _NAMES if c != self.code], self.source
        for code in codes:
            if code == self.code:
                continue  # this dtype's message: this receive's own probe takes it
            msg = self.comm.Improbe(source, base + code, probe)
            if msg is None:
                continue
            self.abandon()  # a posted receive: withdrawn
            self.status = probe
            self._drain(msg)

    def _drain(self, msg: Any) -> None:
        """Receive the matched message ``msg`` into a buffer of its own, then raise."""
        n = self.status.Get_count(MPI.BYTE)
        source, code = self.status.source, self.status.tag % CODES
        msg.Recv([np.empty(n, np.uint8), MPI.BYTE])
        raise self._mismatch(n, code, source)

    def _landed(self) -> bool:
        got = self.status.Get_count(MPI.BYTE)
        null = self.source == MPI.PROC_NULL  # nothing came: out is left as it is
        if got != self.out.nbytes and not null:
            raise self._mismatch(got, self.code, self.status.source)
        if self.target is not self.flat and got and not null:
            _device.landed(self.flat, self.target)
        if self.result_status is not None:
            s = self.result_status
            s.source, s.error = self.status.source, MPI.SUCCESS
            s.tag = self.status.tag // CODES if self.status.tag >= 0 else self.status.tag
            s.Set_elements(MPI.BYTE, 0 if null else got)
        return True

    def _mismatch(self, nbytes: int | None, code: int, source: int | None) -> ValueError:
        sender = f"rank {source}" if source is not None and source >= 0 else \
            ("another rank" if self.source == MPI.ANY_SOURCE else f"rank {self.source}")
        sent = f"more elements of {_NAMES[code]} (out's contents are undefined)" \
            if nbytes is None else _describe(nbytes, code)
        mine = _describe(self.out.nbytes, self.code)
        return ValueError(f"{self.kind}: the message does not fit out: out has {mine}, {sender} "
                          f"sent {sent} (tag {self.tag if self.tag >= 0 else 'any'}); "
                          "send and receive must have the same count and dtype")

    def abandon(self) -> None:
        """Withdraw a posted receive (``MPI_Cancel``). A probing one has nothing to withdraw:
        it posts nothing before its message is matched, and a matched one completes, its
        sender sending."""
        if not self.posted or self.req == MPI.REQUEST_NULL:
            return
        req, self.req = self.req, MPI.REQUEST_NULL
        req.Cancel()
        try:
            req.Wait()
        except MPI.Exception:  # it had matched a longer message: discarded
            pass

    def waiting(self) -> str:
        who = "any rank" if self.source == MPI.ANY_SOURCE else f"rank {self.source}"
        tag = "any tag" if self.tag == MPI.ANY_TAG else f"tag {self.tag}"
        return (f"recv from {who} ({tag}, {_describe(self.out.nbytes, self.code)}): no "
                "message has come")

    @property
    def peer(self) -> int:
        return self.source

    @property
    def dtype(self) -> str:
        return dtype_name(self.code)


def _returns_errors(comm: MPI.Comm) -> bool:
    """Whether MPI errors on ``comm`` come back as exceptions (mpi4py's default), so that a
    posted receive's truncation error can be reported rather than end the job."""
    handler = comm.Get_errhandler()
    if handler == MPI.ERRORS_RETURN:
        return True
    if handler not in (MPI.ERRORS_ARE_FATAL, MPI.ERRORS_ABORT):
        handler.Free()  # a user's handler: the reference Get_errhandler took
    return False


def _complete(ops: list[Any], kind: str, timeout: float | None, abandon: bool = True) -> None:
    """Test ``ops`` (sends and receives) until every one is done, yielding the processor between
    tests. An op that raises (a receive's mismatch) is done: the others are still waited for
    (the send of a ``sendrecv`` is delivered), then its error is raised. With ``timeout``,
    TimeoutError once that many seconds have passed; the ops still in flight are withdrawn
    (``abandon``) or stay in flight (a request's wait, which may be called again)."""
    if len(ops) == 1:
        _wait_one(ops[0], kind, timeout, abandon)
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    error = None
    left, spins = ops, 0
    while True:
        todo = []
        for op in left:
            try:
                if not op.test():
                    todo.append(op)
            except Exception as exc:  # noqa: BLE001 - raised once the others are done
                error = error or exc
        left = todo
        if not left:
            break
        spins += 1
        if _past(spins, deadline):
            if abandon:
                for op in left:
                    op.abandon()
            raise TimeoutError(f"{kind}: timed out after {timeout:g} s (Options.timeout): "
                               + "; ".join(op.waiting() for op in left)) from error
    if error is not None:
        raise error


def _wait_one(op: Any, kind: str, timeout: float | None, abandon: bool) -> None:
    """:func:`_complete` of one op (its error raised at once: nothing else to wait for)."""
    if op.test():
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    spins = 0
    while not op.test():
        spins += 1
        if _past(spins, deadline):
            if abandon:
                op.abandon()
            raise TimeoutError(f"{kind}: timed out after {timeout:g} s (Options.timeout): "
                               + op.waiting())


def _past(spins: int, deadline: float | None) -> bool:
    """Between two rounds of tests of a wait: nothing for the first few (a core per rank), then
    yield the processor, and past :data:`_SPINS` rounds (with a deadline only) sleep a little;
    True once the deadline has passed."""
    if spins <= TESTS_BEFORE_YIELD:
        return False
    if deadline is None or spins <= _SPINS:
        _yield()
        return False
    time.sleep(_NAP_S)
    return time.monotonic() > deadline


def _observed(kind: str, ops: tuple, body: Any, *args: Any) -> None:
    """``body(*args)``, the whole of a blocking call on the messages ``ops``: the observers of
    ``pt2pt`` told of each message's start and end (module docstring); a TimeoutError asks
    for the flight recorder's dump."""
    observers = _OBSERVED.pt2pt
    if observers:
        t0 = _clock()
        for observe in observers:
            for op in ops:
                observe(kind, op, t0, None, None)
    try:
        body(*args)
    except BaseException as exc:
        _failed(observers, kind, ops, t0 if observers else 0.0, exc)
        raise
    if observers:
        _ended(observers, kind, ops, t0, None)


def _failed(observers: tuple, kind: str, ops: tuple, t0: float, exc: BaseException) -> None:
    """A blocking call that raises ``exc``: its messages' ends told (when their starts were),
    and a TimeoutError asks for the flight recorder's dump."""
    if observers:
        _ended(observers, kind, ops, t0, type(exc).__name__)
    if isinstance(exc, TimeoutError):
        flight.auto_dump("timeout", exc)


def _ended(observers: tuple, kind: str, ops: tuple, t0: float, error: str | None) -> None:
    t1 = _clock()
    for observe in observers:
        for op in ops:
            observe(kind, op, t0, t1, error)


# -- the call classes ----------------------------------------------------------------------------
class _OneMessage:
    """A blocking call of one message (``send``, ``recv``): ``run`` tells the observers of
    ``pt2pt`` its start and end around its message's ``transfer`` (as :func:`_observed`, in
    line: a repeated message's Python is on its exchange's critical path)."""

    __slots__ = ()

    def run(self, comm: MPI.Comm) -> None:
        op, observers = self.op, _OBSERVED.pt2pt
        if observers:  # -- observers: the message's start
            t0 = _clock()
            for observe in observers:
                observe(self.kind, op, t0, None, None)
        try:
            op.transfer(self.timeout)
        except BaseException as exc:
            _failed(observers, self.kind, (op,), t0 if observers else 0.0, exc)
            raise
        if observers:  # -- observers: its end
            t1 = _clock()
            for observe in observers:
                observe(self.kind, op, t0, t1, None)


class SendCall(_OneMessage):
    """A checked blocking send (``run`` sends)."""

    kind = "send"
    __slots__ = ("op", "timeout", "result")

    def __init__(self, comm: MPI.Comm, x: Any, dest: int, tag: int, opts: Options) -> None:
        a, code = _array(x, "x", self.kind)
        self.op = _Send(comm, a, code, _peer(comm, dest, "dest", self.kind, False),
                        _tag(tag, "tag", self.kind, False), "send")
        self.timeout, self.result = opts.timeout, None


class RecvCall(_OneMessage):
    """A checked blocking receive (``run`` receives into ``out``, or raises)."""

    kind = "recv"
    __slots__ = ("op", "timeout", "result")

    def __init__(self, comm: MPI.Comm, out: Any, source: int, tag: int,
                 status: MPI.Status | None, opts: Options) -> None:
        self.op = _receive(comm, self.kind, out, source, tag, status, "recv")
        self.timeout, self.result = opts.timeout, out


class SendrecvCall:
    """A checked send and receive at once (``run``: both, the receive posted first)."""

    kind = "sendrecv"
    __slots__ = ("send", "recv", "timeout", "result")

    def __init__(self, comm: MPI.Comm, x: Any, dest: int, out: Any, source: int, sendtag: int,
                 recvtag: int, status: MPI.Status | None, opts: Options) -> None:
        a, code = _array(x, "x", self.kind)
        self.recv = _receive(comm, self.kind, out, source, recvtag, status, "recv")
        if _overlaps(a, self.recv.out):
            raise ValueError(f"{self.kind}: out overlaps x (MPI_Sendrecv needs separate buffers)")
        self.send = _Send(comm, a, code, _peer(comm, dest, "dest", self.kind, False),
                          _tag(sendtag, "sendtag", self.kind, False), "send")
        self.timeout, self.result = opts.timeout, out

    def run(self, comm: MPI.Comm) -> None:
        _observed(self.kind, (self.send, self.recv), self._both)

    def _both(self) -> None:
        _complete([self.recv.start(), self.send.start()], self.kind, self.timeout)


def _receive(comm: MPI.Comm, kind: str, out: Any, source: int, tag: int,
             status: MPI.Status | None, staging: str | None) -> _Recv:
    a, code = _array(out, "out", kind)
    if not writeable(a):
        raise ValueError(f"{kind}: out is read-only")
    if status is not None and not isinstance(status, MPI.Status):
        raise TypeError(f"{kind}: status must be an MPI.Status or None, got "
                        f"{type(status).__name__}")
    return _Recv(comm, kind, a, code, _peer(comm, source, "source", kind, True),
                 _tag(tag, "tag", kind, True), staging, status)


def _overlaps(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if is_numpy(a):
        return a.nbytes > 0 and b.nbytes > 0 and np.may_share_memory(a, b)
    return a.nbytes > 0 and b.nbytes > 0 and a.data.ptr < b.data.ptr + b.nbytes and \
        b.data.ptr < a.data.ptr + a.nbytes


# -- remembered messages -------------------------------------------------------------------------
class _Open:
    """Where a remembered message runs: the caller's communicator, ``live`` until freed."""

    __slots__ = ("comm",)

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm

    #: truthy while the communicator is not freed: the communicator itself, whose truth is
    #: ``comm != MPI.COMM_NULL`` (a getter in C: every repeat reads it, and a property in
    #: Python would add a frame)
    live = property(attrgetter("comm"))


class _Checked:
    """What :class:`Repeat` reads of a checked call: the one array and the options. A receive
    writes its array (``src`` and ``dst``, as an in-place call's: its write flag counts); a
    send only reads it (``dst`` None: its write flag is not compared)."""

    __slots__ = ("src", "dst", "opts")

    def __init__(self, a: np.ndarray, opts: Options, writes: bool) -> None:
        self.src, self.dst = a, a if writes else None
        self.opts = opts


class _Message(Repeat):
    """A remembered blocking ``send`` or ``recv`` of a NumPy array of a built-in dtype
    (``_runtime/repeats.py``, keyed by the array, tag, peer, ``comm`` and ``options=``
    arguments): its checked call, made once more on a view of the array's memory that keeps
    nothing alive (:func:`~.arrays.unowned`), runs again while the array is the same object
    with the same shape, strides and dtype (a receive's: and write flag) and the communicator
    is not freed."""

    __slots__ = ("call", "comm")

    def __init__(self, form: str, cls: type, a: np.ndarray, peer: int, tag: int, comm_arg: Any,
                 comm: MPI.Comm, options: Any, opts: Options) -> None:
        kind = kind_of(a)
        super().__init__(form, _Checked(a, opts, cls is RecvCall), a, a, tag, peer, comm_arg, options,
                         _Open(comm), kind, kind)
        view = unowned(a)
        self.call = cls(comm, view, peer, tag, opts) if cls is SendCall else \
            cls(comm, view, peer, tag, None, opts)
        self.comm = comm


def _remember(form: str, cls: type, a: Any, peer: Any, tag: Any, comm_arg: Any, comm: MPI.Comm,
              options: Any) -> None:
    """Remember the blocking message just made (:class:`_Message`) where it can repeat."""
    if type(a) is np.ndarray and a.size and a.dtype in _BY_DTYPE and type(peer) is int and \
            type(tag) is int:
        opts, problem = resolve(options)
        if problem is None:
            REPEATS.remember(_Message(form, cls, a, peer, tag, comm_arg, comm, options, opts))


_find = REPEATS.find


# -- the public functions ------------------------------------------------------------------------
def send(x: Any, dest: int, *, tag: int = 0, comm: MPI.Comm | None = None,
         options: Options | None = None) -> None:
    """Send the array ``x`` to rank ``dest`` of ``comm`` (default ``COMM_WORLD``), as
    ``comm.Send(x, dest, tag)``; the receiver's ``out`` must have ``x``'s count and dtype.

    With ``Options.timeout`` it raises ``TimeoutError`` if the message has not left after that
    many seconds (a large message waits for its receive). A send repeated with the same NumPy
    ``x``, ``dest``, ``tag``, ``comm`` and ``options=`` arguments is remembered, as a repeated
    ``allreduce`` is (``_runtime/repeats.py``: checked once, re-checked for what can change in
    place; made without ``options=``, it keeps the options its first call read)."""
    e = _find("send", x, x, tag, dest, comm, options)
    if e is not None:
        e.call.run(e.comm)
        return
    call, c = prepare_local(SendCall, comm, options, x, dest, tag)
    call.run(c)
    _remember("send", SendCall, x, dest, tag, comm, c, options)


def recv(out: Any, source: int, *, tag: int = 0, comm: MPI.Comm | None = None,
         options: Options | None = None, status: MPI.Status | None = None) -> Any:
    """Receive a message from rank ``source`` (or ``MPI.ANY_SOURCE``) with ``tag`` (or
    ``MPI.ANY_TAG``) into ``out``, and return ``out``, as ``comm.Recv(out, source, tag)``.

    A message of another count or dtype than ``out``'s raises ``ValueError`` (module
    docstring); ``status`` (an ``MPI.Status``) gets the sender's rank and tag. With
    ``Options.timeout``, ``TimeoutError`` once no message has come for that many seconds.
    Without ``status``, a receive repeated as :func:`send`'s is remembered the same way."""
    if status is None:
        e = _find("recv", out, out, tag, source, comm, options)
        if e is not None:
            e.call.run(e.comm)
            return out
    call, c = prepare_local(RecvCall, comm, options, out, source, tag, status)
    call.run(c)
    if status is None:
        _remember("recv", RecvCall, out, source, tag, comm, c, options)
    return call.result


def sendrecv(x: Any, dest: int, out: Any, source: int, *, sendtag: int = 0, recvtag: int = 0,
             comm: MPI.Comm | None = None, options: Options | None = None,
             status: MPI.Status | None = None) -> Any:
    """Send ``x`` to ``dest`` while receiving into ``out`` from ``source``; returns ``out``
    (``comm.Sendrecv``). The rules of :func:`send` and :func:`recv` apply to each half."""
    return run_local(SendrecvCall, comm, options, x, dest, out, source, sendtag, recvtag,
                     status).result


# -- non-blocking ----------------------------------------------------------------------------
class P2PRequest:
    """A point-to-point message in flight (``isend``, ``irecv``), as ``MPI.Request``: until it
    completes, it owns its array. ``test()`` says whether it has completed (raising a receive's
    size or dtype mismatch), ``wait(timeout=None)`` waits and returns the received ``out``
    (None for a send); ``timeout`` defaults to the call's ``Options.timeout``."""

    __slots__ = ("kind", "op", "timeout", "result", "done", "error", "t0")

    def __init__(self, kind: str, op: Any, timeout: float | None, result: Any) -> None:
        self.kind, self.op, self.timeout, self.result = kind, op, timeout, result
        self.done, self.error = False, None
        observers = _OBSERVED.pt2pt  # -- observers: its start (its end: _finished)
        self.t0 = flight.clock() if observers else None
        for observe in observers:
            observe(kind, op, self.t0, None, None)

    def test(self) -> bool:
        if not self.done:
            try:
                self.done = self.op.test()
            except Exception as exc:
                self.done, self.error = True, exc
            if self.done:
                self._finished()
        if self.error is not None:
            raise self.error
        return self.done

    def wait(self, timeout: float | None = None) -> Any:
        if not self.done:
            try:
                _complete([self.op], self.kind, self.timeout if timeout is None else timeout,
                          abandon=False)
                self.done = True
            except TimeoutError as exc:
                flight.auto_dump("timeout", exc)
                raise  # still in flight: wait() may be called again
            except Exception as exc:
                self.done, self.error = True, exc
            self._finished()
        if self.error is not None:
            raise self.error
        return self.result

    def _finished(self) -> None:
        """Tell the observers of ``pt2pt`` that the message has ended (those that heard its
        start: none when nobody observed it then)."""
        if self.t0 is not None:
            _ended(_OBSERVED.pt2pt, self.kind, (self.op,), self.t0,
                   None if self.error is None else type(self.error).__name__)

    def __repr__(self) -> str:
        return f"<P2PRequest {self.kind} {'done' if self.done else 'in flight'}>"


class _IsendCall(SendCall):
    kind = "isend"
    __slots__ = ()

    def __init__(self, comm: MPI.Comm, x: Any, dest: int, tag: int, opts: Options) -> None:
        a, code = _array(x, "x", self.kind)
        self.op = _Send(comm, a, code, _peer(comm, dest, "dest", self.kind, False),
                        _tag(tag, "tag", self.kind, False), None)
        self.timeout = opts.timeout

    def run(self, comm: MPI.Comm) -> None:
        self.result = P2PRequest(self.kind, self.op.start(), self.timeout, None)


class _IrecvCall(RecvCall):
    kind = "irecv"
    __slots__ = ()

    def __init__(self, comm: MPI.Comm, out: Any, source: int, tag: int,
                 status: MPI.Status | None, opts: Options) -> None:
        self.op = _receive(comm, self.kind, out, source, tag, status, None)
        self.timeout = opts.timeout
        self.result = out

    def run(self, comm: MPI.Comm) -> None:
        self.result = P2PRequest(self.kind, self.op.start(), self.timeout, self.result)


def isend(x: Any, dest: int, *, tag: int = 0, comm: MPI.Comm | None = None,
          options: Options | None = None) -> P2PRequest:
    """Start sending ``x`` to ``dest`` (:func:`send`'s rules); ``wait()`` the request before
    writing ``x`` again."""
    return run_local(_IsendCall, comm, options, x, dest, tag).result


def irecv(out: Any, source: int, *, tag: int = 0, comm: MPI.Comm | None = None,
          options: Options | None = None, status: MPI.Status | None = None) -> P2PRequest:
    """Start receiving into ``out`` (:func:`recv`'s rules); ``wait()`` returns ``out``."""
    return run_local(_IrecvCall, comm, options, out, source, tag, status).result


# -- persistent ------------------------------------------------------------------------------
class P2PPlan:
    """A send or receive checked once and run by each call (``send_init``, ``recv_init``, as
    ``MPI_Send_init``/``MPI_Recv_init``): ``plan()`` sends ``x`` as it is then, or receives
    into ``out`` and returns it, with the rules and the timeout of :func:`send` and
    :func:`recv`. Nothing is checked again: the arrays must keep their memory (not be
    resized or reallocated) while the plan is used."""

    __slots__ = ("call", "comm")

    def __init__(self, call: Any, comm: MPI.Comm) -> None:
        self.call, self.comm = call, comm

    def __call__(self) -> Any:
        self.call.run(self.comm)
        return self.call.result

    def __repr__(self) -> str:
        return f"<P2PPlan {self.call.kind}>"


def send_init(x: Any, dest: int, *, tag: int = 0, comm: MPI.Comm | None = None,
              options: Options | None = None) -> P2PPlan:
    """A persistent :func:`send` of ``x`` to ``dest``: ``plan()`` sends it."""
    return P2PPlan(*prepare_local(SendCall, comm, options, x, dest, tag))


def recv_init(out: Any, source: int, *, tag: int = 0, comm: MPI.Comm | None = None,
              options: Options | None = None, status: MPI.Status | None = None) -> P2PPlan:
    """A persistent :func:`recv` into ``out`` from ``source``: ``plan()`` receives and returns
    ``out``."""
    return P2PPlan(*prepare_local(RecvCall, comm, options, out, source, tag, status))
