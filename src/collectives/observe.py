"""Observation points: where the timeline, the schedule trace and the flight recorder hear what
the library does.

Each point is one attribute of :data:`OBSERVERS`, a tuple of callables (the *observers*)
that the library's own code calls at that place, in registration order, only when the tuple
is not empty: with nothing registered a point costs one test (``if observers:``), and no
function of the library is ever replaced or wrapped. :func:`register` and :func:`unregister`
replace a point's tuple with a new one (under a lock), so that a thread running the library
sees either the old tuple or the new one, never one that changes under it.

The points, what the library does there, and what each observer is called with
(:data:`POINTS` holds the same table, each point's observer type below it):

===================  ======================================  =====================================
point                where                                   observer(...)
===================  ======================================  =====================================
``call``             a public call ends: ``Guard.run``,      ``(name, t0, t1, seq, what, call,
                     abort mode's ``Runner.run``             error)``: the flight recorder's
                                                             description ``what`` (or None), the
                                                             checked call, the error's type name
                                                             (or None)
``submit``           a non-blocking call returns             ``(kind, name, t0, t1)``
                     (``nonblocking._submit``: its checks
                     and its queueing)
``request``          the engine completes a request          ``(request, error)``
                     (``Request.complete``, before its
                     waiters wake)
``wait``             a ``wait()``/``waitall()`` that blocks  ``(requests, t0, t1)``
                     (``engine.requests.wait_for``)
``message``          a guarded wait for one exchange round   ``(native, peers, expect, t0, t1)``
                     (``Guard.complete``; ``native``: an
                     MPI collective)
``p2p``              a point-to-point operation is posted    ``(comm, dest, sent, source,
                     (``_runtime/p2p.py``)                   received)``: -1 and 0 for no send or
                                                             no receive
``pt2pt``            a public point-to-point call's message  ``(kind, op, t0, t1, error)``: kind
                     starts, and ends (``pt2pt/messages.py``: ``"send"``, ``"recv"``, ...; ``op``
                     ``send``, ``recv``, ``sendrecv``'s two  the message, with ``side`` ("send"
                     halves, ``isend``/``irecv`` from their  or "recv"), ``comm``, ``peer``,
                     posting to their request's end)         ``tag``, ``nbytes``, ``dtype``
                                                             (``code``: its number);
                                                             ``t1`` None at the start; the
                                                             error's type name (or None)
``shm``              a pass through a node's shared window   ``(comm, mode, nbytes, t0, t1)``:
                     (``Team.run``; a lane takes it while    ``mode`` one of ``shmem.layout``'s
                     one is registered)                      modes
``codec``            a codec's work inside a compressed      ``(phase, t0, t1)``: ``"encode"``,
                     allreduce (``TensorCoding.encode``,     ``"decode"`` or ``"aggregate"``
                     ``.decode``, ``.aggregate_into``)
``reduce``           a local reduction (``ops.Op.combine``)  ``(op, nbytes, t0, t1)``
``timeline_option``  a call made with ``Options.timeline``   ``(path, comm)``
                     (``validate.setup``)
``dump``             a timeout, a stall or a crash that      ``(reason, error)``: ``"timeout"``,
                     warrants a dump of what led to it       ``"stall"``, ``"crash"`` or
                     (``flight.auto_dump``)                  ``"argument error"``
===================  ======================================  =====================================

Times are ``time.perf_counter()`` seconds (the flight recorder's clock). Observers run on the thread that
reaches the point (the caller's, or a progress engine's), inside the library's call: they
must be quick and must not raise (what one raises propagates into the call, except at
``dump``, whose errors are printed and dropped). Who registers where: the timeline
(``collectives/timeline/hooks.py``) on every timed point while it records, and on
``timeline_option`` at import; the schedule trace (``_runtime/trace.py``) on ``p2p`` and
``shm`` while it records; the flight recorder (``collectives/flight_recorder.py``) on ``dump``
and ``pt2pt`` at import (while it is on).

This module imports nothing of the library, so that every floor may use it (``ops`` included).
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable, Protocol, Sequence

__all__ = ["OBSERVERS", "POINTS", "Observers", "register", "unregister"]


class CallObserver(Protocol):
    def __call__(self, name: str, t0: float, t1: float, seq: int, what: tuple | None,
                 call: Any, error: str | None, /) -> None: ...


class SubmitObserver(Protocol):
    def __call__(self, kind: str, name: str | None, t0: float, t1: float, /) -> None: ...


class RequestObserver(Protocol):
    def __call__(self, request: Any, error: BaseException | None, /) -> None: ...


class WaitObserver(Protocol):
    def __call__(self, requests: Sequence[Any], t0: float, t1: float, /) -> None: ...


class MessageObserver(Protocol):
    def __call__(self, native: bool, peers: list[int], expect: list[int | None], t0: float,
                 t1: float, /) -> None: ...


class P2pObserver(Protocol):
    def __call__(self, comm: Any, dest: int, sent: int, source: int, received: int, /
                 ) -> None: ...


class Pt2ptObserver(Protocol):
    def __call__(self, kind: str, op: Any, t0: float, t1: float | None, error: str | None, /
                 ) -> None: ...


class ShmObserver(Protocol):
    def __call__(self, comm: Any, mode: int, nbytes: int, t0: float, t1: float, /) -> None: ...


class CodecObserver(Protocol):
    def __call__(self, phase: str, t0: float, t1: float, /) -> None: ...


class ReduceObserver(Protocol):
    def __call__(self, op: str, nbytes: int, t0: float, t1: float, /) -> None: ...


class TimelineOptionObserver(Protocol):
    def __call__(self, path: str, comm: Any, /) -> None: ...


class DumpObserver(Protocol):
    def __call__(self, reason: str, error: BaseException | None, /) -> None: ...


#: Every observation point by name, and the type of its observers (the module's table).
POINTS: dict[str, type] = {
    "call": CallObserver,
    "submit": SubmitObserver,
    "request": RequestObserver,
    "wait": WaitObserver,
    "message": MessageObserver,
    "p2p": P2pObserver,
    "pt2pt": Pt2ptObserver,
    "shm": ShmObserver,
    "codec": CodecObserver,
    "reduce": ReduceObserver,
    "timeline_option": TimelineOptionObserver,
    "dump": DumpObserver,
}


class Observers:
    """The observers of every point, one tuple per point (empty: nobody observes)."""

    __slots__ = (*POINTS, "_lock")

    call: tuple[CallObserver, ...]
    submit: tuple[SubmitObserver, ...]
    request: tuple[RequestObserver, ...]
    wait: tuple[WaitObserver, ...]
    message: tuple[MessageObserver, ...]
    p2p: tuple[P2pObserver, ...]
    pt2pt: tuple[Pt2ptObserver, ...]
    shm: tuple[ShmObserver, ...]
    codec: tuple[CodecObserver, ...]
    reduce: tuple[ReduceObserver, ...]
    timeline_option: tuple[TimelineOptionObserver, ...]
    dump: tuple[DumpObserver, ...]

    def __init__(self) -> None:
        for point in POINTS:
            setattr(self, point, ())
        self._lock = threading.Lock()

    def register(self, point: str, observer: Callable[..., None]) -> None:
        """Call ``observer`` at ``point`` from now on (after the observers already there). An
        observer registered twice is called twice; one that cannot take the point's arguments
        (:data:`POINTS`) is refused here, with a ``TypeError``, rather than at the point."""
        _point(point)
        if not callable(observer):
            raise TypeError(f"an observer of {point!r} must be callable, got "
                            f"{type(observer).__name__}")
        arity = _arity(point)
        try:
            inspect.signature(observer).bind(*range(arity))
        except TypeError as exc:
            raise TypeError(f"an observer of {point!r} is called with {arity} positional "
                            f"arguments ({POINTS[point].__name__}): {observer!r} cannot take "
                            f"them ({exc})") from None
        except ValueError:  # no signature to read (some builtins): taken as it is
            pass
        with self._lock:
            setattr(self, point, (*getattr(self, point), observer))

    def unregister(self, point: str, observer: Callable[..., None]) -> bool:
        """Stop calling ``observer`` at ``point`` (its latest registration); False if it was
        not registered there."""
        _point(point)
        with self._lock:
            current = getattr(self, point)
            for i in range(len(current) - 1, -1, -1):
                if current[i] == observer:
                    setattr(self, point, current[:i] + current[i + 1:])
                    return True
        return False

    def __repr__(self) -> str:
        busy = {p: len(getattr(self, p)) for p in POINTS if getattr(self, p)}
        return f"<Observers {busy or 'none'}>"


def _arity(point: str) -> int:
    """How many positional arguments the observers of ``point`` take."""
    return len(inspect.signature(POINTS[point].__call__).parameters) - 1  # less self


def _point(point: object) -> str:
    if not isinstance(point, str) or point not in POINTS:
        raise ValueError(f"unknown observation point {point!r}; valid points: "
                         f"{', '.join(POINTS)}")
    return point


#: The observers in force: what the library's code reads at each point.
OBSERVERS = Observers()
#: ``register(point, observer)`` and ``unregister(point, observer)`` of :data:`OBSERVERS`
register, unregister = OBSERVERS.register, OBSERVERS.unregister
