"""Requests: non-blocking operations in flight, and waiting for them (``MPI_Request``).

A :class:`Request` is created by a non-blocking call (``collectives.iallreduce`` ...) and
completed by the communicator's progress engine. Until then it *owns its buffers*, as in MPI:
writing the input or reading the output before :meth:`Request.wait` (or a ``True`` from
:meth:`Request.test`) is undefined. ``wait()`` returns the operation's result (what the blocking
function would have returned) or raises the exception the operation raised on this rank, with
its original traceback.

Waiting (:func:`wait_for`) sleeps on one condition variable that every completion notifies, so
any number of threads may wait for any mix of requests. A wait longer than
``Options.stall_warning`` warns (:class:`StallWarning`) which ranks have not submitted the
operation; one longer than ``Options.timeout`` (or the ``timeout`` argument) raises
``TimeoutError`` naming the operation. The operation itself stays in flight after a timeout: a
late rank still completes it, and ``wait()`` may be called again.

A small operation (at most ``engine.INLINE_BYTES``) submitted while its engine is idle is run by
its own ``wait()`` on the caller's thread instead of the engine's thread (no hand-off); anything
else that needs it (``test()``, a callback, a wait with a time limit or on several requests, the
next submission) hands it to the engine's thread, which also starts it by itself within
``IDLE_POLL_S``.

Completion callbacks (:meth:`Request.add_done_callback`, as ``concurrent.futures.Future``'s) run
on the thread that completes the request, right after its waiters are woken: the communicator's
engine thread (named operations: its named-operation thread), or the caller's thread when the
request is already complete at registration. Requests that nobody waits on, their completion
running callbacks instead (the DDP hook's), get a wait's stall warning and timeout from
:func:`watch`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
from typing import Any, Callable, Sequence

from .._runtime import flight
from ..observe import OBSERVERS as _OBSERVED

__all__ = ["Request", "StallWarning", "EngineError", "waitall", "waitany", "testall", "watch",
           "wait_for", "wait_done", "DONE"]

#: Notified (under its lock) whenever any request completes and a thread waits on it
#: (:func:`wait_done`).
_DONE_LOCK = threading.Lock()
DONE = threading.Condition(_DONE_LOCK)
_WAITING = [0]  # threads inside wait_done: complete() notifies only if there are any


def wait_done(timeout: float | None) -> None:
    """``DONE.wait(timeout)``, counted (hold ``DONE``'s lock): wait for the next completion."""
    _WAITING[0] += 1
    try:
        DONE.wait(timeout)
    finally:
        _WAITING[0] -= 1

LOG = logging.getLogger(__name__)
_clock = time.perf_counter


class StallWarning(RuntimeWarning):
    """An operation has waited longer than ``Options.stall_warning`` (Horovod's stall check)."""


class EngineError(RuntimeError):
    """A communicator's engine can run no more operations (an earlier one failed, or shutdown)."""


class Request:
    """A non-blocking collective operation (see the module docstring).

    Attributes
    ----------
    kind
        The non-blocking call that made it ("iallreduce", ...).
    seq
        Its number among the operations submitted on its communicator (0, 1, ...).
    started, finished
        ``time.perf_counter()`` when the engine started and finished it (None before).
    """

    __slots__ = ("kind", "call", "engine", "seq", "validate", "local_error", "opts", "name",
                 "inline", "what", "started", "finished", "_done", "_error", "_callbacks",
                 "__weakref__")

    def __init__(self, kind: str, call: Any, engine: Any, validate: bool, opts: Any,
                 local_error: Exception | None = None, name: str | None = None) -> None:
        self.kind, self.call, self.engine = kind, call, engine
        self.validate, self.local_error, self.opts, self.name = validate, local_error, opts, name
        self.seq = -1
        #: small: its wait() may run it on the caller's thread (engine.py, INLINE_BYTES)
        self.inline = False
        #: the flight recorder's description (``flight.describe``) if made once for many runs
        self.what: tuple | None = None
        self.started: float | None = None
        self.finished: float | None = None
        self._done = False
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Request], Any]] | None = None  # until completion

    # -- the MPI_Test / MPI_Wait interface -------------------------------------------------------
    def test(self) -> bool:
        """Whether the operation has completed (successfully or not); never blocks."""
        if not self._done:
            _kick(self)
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the operation completes; return its result.

        Parameters
        ----------
        timeout
            Seconds to wait at most (default ``Options.timeout`` of the call: None, for ever).

        Raises
        ------
        TimeoutError
            The operation did not complete in time (it stays in flight).
        Exception
            Whatever the operation raised on this rank, with its original traceback.
        """
        if not self._done:
            engine = self.engine
            if getattr(engine, "_deferred", None) is self:  # small, and not started yet
                if timeout is None and self.opts.timeout is None:
                    engine.run_deferred(self, self.opts.stall_warning)  # on this thread
                else:  # a time limit: the engine's thread runs it, this one keeps the clock
                    engine.kick(self)
            if not self._done:
                wait_for([self], timeout, all)
        if self._error is not None:
            raise self._error
        return None if self.call is None else self.call.result

    def add_done_callback(self, fn: Callable[["Request"], Any]) -> None:
        """Call ``fn(request)`` once the operation has completed, successfully or not.

        As ``concurrent.futures.Future.add_done_callback``: if the request has already completed,
        ``fn`` runs at once, on the calling thread; otherwise it runs once, on the thread that
        completes the request, after :meth:`wait` has been woken: the communicator's progress
        engine thread (``collectives-engine ...``; for ``name=`` operations its
        ``collectives-named ...`` thread; or a thread whose :meth:`wait` was already running
        a small operation itself, ``engine.py``). Callbacks run in the order they were added. Inside
        one, :meth:`test` is True and :meth:`wait` returns the result or raises the operation's
        exception at once.

        ``fn`` runs on the engine: every later operation of the communicator waits for it. Keep
        it quick (set a flag, complete a future, put on a queue); it must not block, call
        blocking collectives, nor ``wait()`` for requests that are not done yet (that thread is
        the one that would complete them). An exception raised by ``fn`` is logged (logger
        ``collectives.engine.requests``, with its traceback, as ``concurrent.futures`` does)
        and ignored: later callbacks and operations go on.

        A persistent :class:`~collectives.engine.nonblocking.Plan` completes once per
        ``plan.start()``, and a callback, as a future's, fires once: it belongs to the run under
        way and fires when that run completes; add it again after each ``start()``. Added when
        no run is under way (before the first ``start()``, or once the run has completed) it
        runs at once, as for any completed request. ``plan()``, the blocking form, never calls
        callbacks.
        """
        _kick(self)  # the engine's thread completes it (and so calls fn), not a wait()
        with DONE:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = [fn]
                else:
                    self._callbacks.append(fn)
                return
        _call_back(fn, self)

    @property
    def result(self) -> Any:
        """The output array (None off the root of a reduce); valid once the request is done."""
        return None if self.call is None else self.call.result

    # -- the engine's side --------------------------------------------------------------------
    def complete(self, error: BaseException | None = None) -> None:
        """Mark the operation finished (with ``error`` if it failed), wake every waiter, then run
        the completion callbacks on this thread. The observers of ``request``
        (``observe.py``: the timeline) hear of it first."""
        observers = _OBSERVED.request  # off, this test only
        if observers:
            for observe in observers:
                observe(self, error)
        with _DONE_LOCK:  # DONE's (a plain lock's with is cheaper than the condition's)
            self._error = error
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
            if _WAITING[0]:
                DONE.notify_all()
        if callbacks is not None:
            for fn in callbacks:
                _call_back(fn, self)

    def describe(self) -> str:
        """``iallreduce #3 (count 1000, dtype float32, op sum, algorithm ring)``."""
        if self.name is not None:
            what = f"{self.kind} {self.name!r}"
        else:
            what = f"{self.kind} #{self.seq}" if self.seq >= 0 else self.kind
        sig = self.call.signature() if self.call is not None else {}
        detail = ", ".join(f"{k} {v}" for k, v in sig.items() if k != "counts")
        return f"{what} ({detail})" if detail else what

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<collectives.Request {self.describe()} {state}>"


def _kick(request: Request) -> None:
    """Hand ``request`` to its engine's thread if it is deferred (``engine.py``: a small
    operation its own ``wait()`` would run)."""
    engine = request.engine
    if getattr(engine, "_deferred", None) is request:
        engine.kick(request)


def stalled(request: Request, waited: float) -> None:
    """Warn that ``request`` has run ``waited`` seconds (a :func:`wait_for`'s stall warning,
    for an operation that its ``wait()`` runs on the caller's thread)."""
    warning = StallWarning(f"waited {waited:.1f} s for {request.engine.report(request)}")
    flight.auto_dump("stall", warning)  # -- flight recorder
    warnings.warn(warning, stacklevel=2)


def _call_back(fn: Callable[[Request], Any], request: Request) -> None:
    """Run one completion callback; log what it raises (the engine must go on)."""
    try:
        fn(request)
    except Exception:  # noqa: BLE001 - a callback's bug must not stop the engine
        LOG.exception("exception calling callback for %r", request)


def _limits(requests: Sequence[Request], timeout: float | None) -> tuple[float, float]:
    """(timeout, stall warning) in seconds for a wait on ``requests`` (inf when off)."""
    inf = float("inf")
    if timeout is None:
        timeouts = [r.opts.timeout for r in requests if r.opts.timeout is not None]
        timeout = min(timeouts) if timeouts else None
    stalls = [r.opts.stall_warning for r in requests if r.opts.stall_warning is not None]
    return (inf if timeout is None else float(timeout)), (min(stalls) if stalls else inf)


def wait_for(requests: Sequence[Request], timeout: float | None,
             satisfied: Callable[[Any], bool]) -> None:
    """Block until ``satisfied(r.test() for r in requests)`` (``all`` or ``any``); the observers
    of ``wait`` (``observe.py``: the timeline) hear of the wait at its end."""
    observers = _OBSERVED.wait  # off, this and the test at the end
    t0 = _clock() if observers else 0.0
    try:
        for r in requests:
            if not r._done:
                _kick(r)
        limit, stall = _limits(requests, timeout)
        start = time.monotonic()
        warned = stall == float("inf")
        while True:
            with DONE:
                while not satisfied(r._done for r in requests):
                    waited = time.monotonic() - start
                    until = limit if warned else min(limit, stall)
                    if waited >= until:
                        break
                    # no limit left (warned, no timeout): an infinite wait overflows time_t
                    wait_done(None if until == float("inf") else until - waited)
                else:
                    return
            waited = time.monotonic() - start
            stuck = [r for r in requests if not r._done]
            if not stuck:
                continue
            report = "; ".join(r.engine.report(r) for r in stuck[:4])
            if len(stuck) > 4:
                report += f"; and {len(stuck) - 4} more"
            if waited >= limit:
                error = TimeoutError(f"timed out after {limit:g} s waiting for {report}")
                flight.auto_dump("timeout", error)  # -- flight recorder
                raise error
            warning = StallWarning(f"waited {waited:.1f} s for {report}")
            flight.auto_dump("stall", warning)  # -- flight recorder
            warnings.warn(warning, stacklevel=3)
            warned = True
    finally:
        if observers:
            t1 = _clock()
            for observe in observers:
                observe(requests, t0, t1)


def waitall(requests: Sequence[Request], timeout: float | None = None) -> list[Any]:
    """Wait for every request (``MPI_Waitall``); return their results in order.

    Raises the first failed request's exception (in list order) once all have completed, or
    ``TimeoutError`` if they did not all complete within ``timeout``.
    """
    requests = list(requests)
    if not all(r._done for r in requests):
        wait_for(requests, timeout, all)
    return [r.wait() for r in requests]


def waitany(requests: Sequence[Request], timeout: float | None = None) -> tuple[int, Any]:
    """Wait until one request has completed (``MPI_Waitany``); return ``(index, result)``.

    The lowest index among the completed requests is returned (completed requests stay
    completed: drop them from the list to wait for the next). Raises the completed request's
    exception if it failed, ``ValueError`` for an empty list.
    """
    requests = list(requests)
    if not requests:
        raise ValueError("waitany needs at least one request")
    if not any(r._done for r in requests):
        wait_for(requests, timeout, any)
    index = next(i for i, r in enumerate(requests) if r._done)
    return index, requests[index].wait()


def testall(requests: Sequence[Request]) -> bool:
    """Whether every request has completed (``MPI_Testall``); never blocks."""
    for r in requests:
        if not r._done:
            _kick(r)
    return all(r._done for r in requests)


_WATCHED: "queue.SimpleQueue[tuple[list[Request], Callable[[TimeoutError], Any]]] | None" = None
_WATCH_LOCK = threading.Lock()


def watch(requests: Sequence[Request], on_timeout: Callable[[TimeoutError], Any]) -> None:
    """Give ``requests`` that nobody waits on (their completion runs callbacks instead) what a
    wait gives: a :class:`StallWarning` after ``Options.stall_warning`` and, after
    ``Options.timeout``, ``on_timeout(error)`` with the ``TimeoutError`` :func:`waitall` would
    raise. One daemon thread of the process (``collectives-watchdog``) waits for the watched
    groups in turn, as a thread calling ``waitall`` on each would; nothing is watched when
    neither limit is set. ``on_timeout`` runs on that thread; the requests stay in flight."""
    inf = float("inf")
    if _limits(requests, None) == (inf, inf):
        return
    global _WATCHED
    with _WATCH_LOCK:
        if _WATCHED is None:
            _WATCHED = queue.SimpleQueue()
            threading.Thread(target=_watchdog, args=(_WATCHED,), daemon=True,
                             name="collectives-watchdog").start()
    _WATCHED.put((list(requests), on_timeout))


def _watchdog(watched: "queue.SimpleQueue[tuple[list[Request], Callable[[TimeoutError], Any]]]"
              ) -> None:
    while True:
        requests, on_timeout = watched.get()
        try:
            wait_for(requests, None, all)
        except TimeoutError as exc:
            try:
                on_timeout(exc)
            except Exception:  # noqa: BLE001 - the watchdog must go on watching
                LOG.exception("exception calling the timeout handler of %r", requests)
