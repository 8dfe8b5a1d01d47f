"""The progress engine: one background thread per communicator runs its non-blocking operations.

Design (Horovod's background thread, one per communicator, on the library's own blocking
algorithms):

- **Private communicators.** At the first non-blocking call on a communicator its engine is
  created: three duplicates (the data communicator, on which operations run, the control
  communicator of :mod:`.control` and the named stream's of :mod:`.named`), made by
  ``MPI_Comm_idup`` and completed before the call returns, so that first call is collective:
  it waits for every rank's first non-blocking call on the communicator (up to
  ``Options.timeout``). The blocking functions use another duplicate
  (``collectives._runtime.context``), so blocking and non-blocking operations of one
  communicator never match each other's messages, whatever the threads do.
- **Submission order.** A submitted :class:`~.requests.Request` gets the next sequence number and
  goes on a FIFO queue, under one lock; the thread runs them one at a time, in that order, each
  with the algorithm code of the blocking functions on the engine's communicator (an
  :class:`~.comm.EngineComm`, whose waits poll instead of spinning). Every rank must submit the
  same operations in the same order, as MPI requires; ``validate=True`` checks that, at the cost
  of one small allgather per operation.
- **Overlap.** The thread holds the GIL only between MPI calls and NumPy kernels (both release
  it), so it progresses while the caller's thread computes in NumPy, PyTorch or sleeps.
- **Failures.** An operation that raises is reported by its request's ``wait()`` on that rank. The
  ranks may now be out of step, so the engine fails every later operation with
  :class:`~.requests.EngineError`; validation errors, raised alike on every rank before anything
  is sent, do not count.
- **Small operations on the caller's thread.** Handing an operation to the thread and its
  completion back costs two thread wake-ups, several times what a small operation takes. A
  request marked ``inline`` (a non-blocking call of at most :data:`INLINE_BYTES`, chosen by
  :mod:`collectives.engine.nonblocking`) submitted while the engine is idle is *deferred*: queued in
  order but without waking the thread. The request's own ``wait()`` then runs it on the
  caller's thread (:meth:`Engine.run_deferred`; an execution lock keeps the engine's
  operations one at a time, in order). Anything else that needs it done hands it to the thread
  as usual: the next submission, ``test()``, a completion callback, a wait with a time limit
  (a timeout or a stall warning that the caller's thread could not give while it runs the
  operation), waits on several requests, shutdown, and the thread itself at its next idle poll
  (:data:`~.control.IDLE_POLL_S`), so a deferred operation nobody asks for still starts.
- **Shutdown** (:mod:`.lifecycle`): at interpreter exit, on ``MPI.Finalize`` and when the
  communicator is freed, queued operations are waited for, then the thread stops and the
  duplicates are freed.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time

import numpy as np
from mpi4py import MPI

from .._runtime.context import Context
from .._runtime.flight import describe
from .._runtime.release import keep, park, release
from .._runtime.validate import local_error, verdict
from .comm import Stopped, Waiter, adopt
from .control import IDLE_POLL_S, Control
from .named import NamedStream
from .requests import DONE, EngineError, Request, stalled, wait_done

__all__ = ["Engine", "describe_comm"]

_STOP = object()

#: Non-blocking operations of at most this many bytes are run on the caller's thread by their
#: ``wait()`` when submitted to an idle engine (see the module docstring).
INLINE_BYTES = 4096


def describe_comm(comm: MPI.Comm) -> str:
    """``MPI_COMM_WORLD (4 ranks)``: a communicator as messages name it (same on every rank)."""
    name = comm.Get_name() or "a communicator"
    return f"{name} ({comm.size} ranks)"


class Engine:
    """The progress engine of one communicator (see the module docstring).

    Attributes
    ----------
    submitted, completed
        Operations submitted to, and finished by, this engine so far.
    running
        Sequence number of the operation under way, or -1.
    failure
        ``(description, exception)`` of the operation that failed on this rank, or None.
    """

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.label = describe_comm(comm)
        self.size, self.rank = comm.size, comm.rank
        data, data_ready = comm.Idup()
        control, control_ready = comm.Idup()
        named, named_ready = comm.Idup()
        self._setup = [data_ready, control_ready, named_ready]
        self.setup_done = threading.Event()
        self.setup_error: BaseException | None = None
        self.waiter = Waiter(self._serve)
        self.named = NamedStream(self.label, self.rank, self.size, named, self.waiter)
        self.comm = adopt(data, self.waiter)
        # native operations run by the engine agree on their signatures (_runtime/agree.py) on
        # the control communicator, whose only other traffic is point-to-point (status queries),
        # which no collective can match; the engine's operations run in one order on every rank
        self.ctx = Context(self.comm, dup=False, control=control)
        self.control = Control(control, self.status)
        self.ready = False
        self.closed = False
        self.submitted = self.completed = 0
        self.pending = 0                   # queued or running
        self.running = -1
        self.failure: tuple[str, BaseException] | None = None
        self.stopped = False
        self._outstanding: dict[int, Request] = {}
        self._lock = threading.Lock()      # sequence numbers and the queue's order
        self._exec = threading.Lock()      # held while an operation runs, on whichever thread
        self._deferred: Request | None = None  # submitted, not queued: its wait() may run it
        self._primed = False               # the thread has made the data context's guard
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @property
    def live(self) -> bool:
        """False once shut down (the communicator freed, MPI finalizing): what a remembered
        ``iallreduce`` re-checks of its engine (``_runtime/repeats.py``), as a remembered
        blocking call re-checks its context's ``live``."""
        return not self.closed

    # -- submission ------------------------------------------------------------------------------
    def submit(self, request: Request) -> Request:
        """Queue ``request`` behind everything submitted before it (thread-safe); a named one
        goes to the named stream."""
        if request.name is not None:
            if self.closed:
                raise EngineError(f"the engine of {self.label} is shut down")
            return self.named.submit(request)
        with self._lock:
            if self.closed:
                raise EngineError(f"the engine of {self.label} is shut down")
            seq = request.seq = self.submitted
            self.submitted = seq + 1
            self._outstanding[seq] = request
            if request.inline and not self.pending and self._primed:
                self._deferred = request  # (nothing pending: no deferred one before it)
            else:
                self._queue_deferred()  # it goes first, and to the thread
                self._queue.put(request)
            self.pending += 1
        return request

    def kick(self, request: Request) -> None:
        """Hand ``request`` to the thread if it is the deferred one (see the module docstring)."""
        if self._deferred is request:
            with self._lock:
                if self._deferred is request:
                    self._queue_deferred()

    def _queue_deferred(self) -> None:
        """Put the deferred request, if any, on the thread's queue (hold ``_lock``)."""
        if self._deferred is not None:
            self._queue.put(self._deferred)
            self._deferred = None

    def run_deferred(self, request: Request, stall: float | None) -> bool:
        """Run ``request`` on this thread if it is the deferred one, warning as a wait would
        (:class:`~.requests.StallWarning`) once it has run ``stall`` seconds; False if it is not
        the deferred one (the thread has it, or has run it)."""
        with self._lock:
            if self._deferred is not request:
                return False
            self._deferred = None
            if not self._exec.acquire(False):  # (not while deferred: the engine is idle)
                self._queue.put(request)
                return False
        waiter = self.waiter
        if stall is not None:
            waiter.alarm = (time.perf_counter() + stall, stalled, request, stall)
        waiter.eager = True  # this thread would only wait: no naps between tests
        error: BaseException | None = None
        try:
            error = self._execute(request)
        except Stopped:
            error = EngineError(f"{request.describe()} was abandoned: the engine of "
                                f"{self.label} was shut down")
        except BaseException as exc:  # KeyboardInterrupt: stopped halfway, so out of step
            self.failure = (request.describe(), exc)
            error = exc
            raise
        finally:
            waiter.alarm = None
            waiter.eager = False
            self._exec.release()
            self._finish(request, error)
        return True

    def _finish(self, request: Request, error: BaseException | None) -> None:
        with self._lock:
            self.pending -= 1
            del self._outstanding[request.seq]
        request.complete(error)

    def complete_setup(self, timeout: float | None) -> None:
        """Complete the duplicates (on the creating thread), then start the engine's thread."""
        try:
            _complete(self.label, self._setup, timeout)
        except BaseException as exc:
            self.setup_error = exc
            self.setup_done.set()
            raise
        self.control.open()
        self.ready = True
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"collectives-engine {self.label}")
        self._thread.start()
        self.setup_done.set()

    def wait_setup(self, timeout: float | None) -> None:
        """For the other threads: wait until the creating thread has completed the setup."""
        if not self.setup_done.wait(timeout):
            raise TimeoutError(f"timed out after {timeout:g} s waiting for the progress engine "
                               f"of {self.label} to be created (by another thread)")
        if self.setup_error is not None:
            raise EngineError(f"the progress engine of {self.label} could not be created: "
                              f"{self.setup_error}")

    # -- the thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        self.ctx.guard  # made on this thread (its flight-recorder ordinal), before any inline run
        self._primed = True
        try:
            while True:
                try:
                    request = self._queue.get(timeout=IDLE_POLL_S)
                except queue.Empty:
                    if self._deferred is not None:  # nobody asked for it: run it here
                        with self._lock:
                            self._queue_deferred()
                    self.control.serve()
                    continue
                if request is _STOP:
                    break
                self._exec.acquire()  # an inline run of the operation before this one ends
                try:
                    error = self._execute(request)
                except Stopped:
                    self._exec.release()
                    self._finish(request, EngineError(f"{request.describe()} was abandoned: "
                                                      f"the engine of {self.label} was shut down"))
                    raise
                self._exec.release()
                self._finish(request, error)
                request = error = None  # the thread keeps no array of a finished operation alive
        except Stopped:
            self._drain(EngineError(f"the engine of {self.label} was shut down before the "
                                    "operation could complete"))
        finally:
            self.control.close()

    def _drain(self, error: BaseException) -> None:
        """Fail everything still queued (shutdown)."""
        while True:
            try:
                request = self._queue.get_nowait()
            except queue.Empty:
                return
            if request is not _STOP:
                with self._lock:
                    self.pending -= 1
                    self._outstanding.pop(request.seq, None)
                request.complete(error)

    def _execute(self, request: Request) -> BaseException | None:
        """Run one operation; return its exception (None on success)."""
        self.running = request.seq
        request.started = time.perf_counter()
        error: BaseException | None = None
        try:
            if self.failure is not None:
                what, exc = self.failure
                raise EngineError(f"{request.describe()} was not run: {what} failed on this rank "
                                  f"({type(exc).__name__}: {exc}), so the ranks of {self.label} "
                                  "may be out of step; use a new communicator")
            agreed = self._agree(request) if request.validate else None
            if agreed is not None:
                error = agreed
            else:
                self.ctx.guard.run(request.kind, request.call.run, self.ctx, call=request.call,
                                   what=request.what or describe(request.call, request.name))
        except Stopped:
            raise
        except Exception as exc:  # noqa: BLE001 - reported by the request's wait()
            error = exc
            if not isinstance(exc, EngineError):
                self.failure = (request.describe(), exc)
        request.finished = time.perf_counter()
        self.running = -1
        self.completed += 1
        return error

    def _agree(self, request: Request) -> Exception | None:
        """``validate=True``: the same error on every rank if the ranks' operations differ.

        Every rank contributes (kind, signature, local error) of its operation with this sequence
        number: a 16-byte digest first (one small allgather), the whole tuples only if the
        digests differ or some rank has an error.
        """
        error = None if request.local_error is None else local_error(request.local_error)
        mine = (request.kind, None if request.call is None else request.call.signature(), error)
        digest = np.frombuffer(hashlib.blake2b(repr(mine).encode(), digest_size=16).digest(),
                               dtype=np.uint8)
        digests = np.empty((self.size, 16), dtype=np.uint8)
        self.comm.Allgather(digest, digests)
        if error is None and (digests == digests[0]).all():
            return None
        everyone = self.comm.allgather(mine)
        name = f"non-blocking operation #{request.seq} on {self.label}"
        kinds = [kind for kind, _, _ in everyone]
        if len(set(kinds)) > 1:
            return ValueError(f"{name}: the ranks submitted different operations ("
                              + ", ".join(f"rank {r}: {k}" for r, k in enumerate(kinds))
                              + "); every rank must submit the same operations in the same order")
        return verdict(f"{kinds[0]} #{request.seq}", [(sig, err) for _, sig, err in everyone])

    # -- status and reports ----------------------------------------------------------------------
    def outstanding(self) -> list[Request]:
        """The requests submitted and not yet finished, in order (named ones last)."""
        with self._lock:
            ordered = [self._outstanding[k] for k in sorted(self._outstanding)]
        return ordered + self.named.outstanding()

    def status(self) -> tuple[int, int, int, int]:
        """(submitted, completed, running, named pending): what the control protocol answers."""
        return self.submitted, self.completed, self.running, self.named.pending

    def _serve(self) -> None:
        self.control.serve()

    def report(self, request: Request) -> str:
        """Why ``request`` is not done: which ranks have not submitted it, or are still busy
        (the stall report: :meth:`.control.Control.report`)."""
        return self.control.report(request, self.label, self.named.report)

    # -- shutdown --------------------------------------------------------------------------------
    def drain(self, grace: float) -> bool:
        """Stop accepting work and wait up to ``grace`` seconds for what is queued."""
        with self._lock:
            self.closed = True
            self._queue_deferred()
        end = time.monotonic() + grace
        with DONE:
            while (self.pending or self.named.pending) and time.monotonic() < end:
                wait_done(min(0.1, max(0.0, end - time.monotonic())))
        return not (self.pending or self.named.pending)

    def halt(self) -> bool:
        """Stop an idle engine's thread without another MPI call (inside ``MPI_Finalize``);
        True if it stopped."""
        self.closed = self.stopped = True
        self.control.finalizing = True
        for thread in self._end_threads():
            if thread is not None:
                thread.join(timeout=0.5)
                if thread.is_alive():
                    return False
        self.control.finalizing = False  # this thread (inside MPI_Finalize) may still call MPI
        self.control.close()
        return True

    def stop(self) -> None:
        """Stop the thread (after :meth:`drain`) and free the duplicates (idempotent)."""
        if self.stopped:
            return
        self.stopped = True
        for thread in self._end_threads():
            if thread is not None and thread.is_alive():
                thread.join(timeout=5.0)
                if thread.is_alive():  # inside a blocking MPI call: leave its communicators
                    return
        if MPI.Is_finalized() or not self.ready:
            return  # (never set up: some rank never came, and its duplicates are still pending)
        self.ctx.free()
        self.named.ctx.free()
        # MPI's own collectives run on the data communicator, their signature checks on the
        # control one; where this rank's guard retired native they may have gone different
        # ways on different ranks, and both are parked, never freed before exit (a release's
        # exchange would run on the very communicator whose operations it counts:
        # _runtime/release.py, step 4)
        for ctx, comm in ((self.ctx, self.comm), (self.named.ctx, self.named.comm)):
            guard = ctx._guard
            if guard is not None and guard.retired:
                keep([(r, None) for r in guard.take_outbox()])  # notices still being sent
                park(comm)
            else:
                release(comm, guard)
        guard = self.ctx._guard
        if guard is not None and guard.retired:
            park(self.control.comm)
        else:
            self.control.comm.Free()

    def _end_threads(self) -> tuple[threading.Thread | None, threading.Thread | None]:
        """Tell both threads to end: the stop mark goes on the queue, the named stream ends once
        nothing is pending, and a wait inside an operation raises ``Stopped`` at its next poll.
        Returns the two threads (None where one never started)."""
        self.waiter.stop = True
        self._queue.put(_STOP)
        self.named.stop()
        return self._thread, self.named.thread


def _complete(label: str, requests: list[MPI.Request], timeout: float | None) -> None:
    """Wait, on the calling thread, for the duplicates of a new engine.

    Done by the caller rather than by the engine's thread: while an ``MPI_Comm_idup`` of a
    communicator is in flight, creating another communicator from it on another thread can hang
    (seen with Open MPI 5), and MPI keeps the communicator referenced (freeing it would not run
    its attributes' delete callbacks). Polls with sleeps, as the engine does.
    """
    if timeout is None:
        Waiter().wait(requests)
        return
    end = time.monotonic() + timeout
    while not MPI.Request.Testall(requests):
        if time.monotonic() > end:
            raise TimeoutError(
                f"timed out after {timeout:g} s creating the progress engine of {label}: the "
                "first non-blocking call on a communicator waits for every rank's first one "
                "(it duplicates the communicator); some rank has not made it, and non-blocking "
                "calls on this communicator cannot work any more")
        time.sleep(1e-3)
