"""The flight recorder: the last N calls of every communicator, kept for a dump.

Each guard (:mod:`.guard`) owns a :class:`Ring` of :data:`DEFAULT_SIZE` preallocated
:class:`Record` objects (``COLLECTIVES_FLIGHT_RECORDER=N`` sets N; 0 turns the recorder off).
Call number ``seq`` takes the record ``seq % N``, overwriting the oldest; recording a call is a
few attribute stores and one clock read, on records made once:

- at entry (:meth:`Guard.run`): the call number, its kind ("allreduce", "iallreduce" ...), a
  *description* (:func:`describe`: name, count, dtype, op, algorithm; a tuple the caller made
  once, or None while only the running call's checked arguments know it) and state "started";
- at exit: state "finished" or "failed" (with the error's type and message), the end time, and
  the description from the checked call if the caller gave none.

A start time would cost a second clock read per call (about 55 ns): the records keep only the
end (``time.perf_counter()``, a monotonic clock; a dump turns it into wall-clock time with one offset), and a dump
gives the running call's start where a deadline says it (``Options.timeout``).
Nothing here formats or allocates per call but the description tuple of a first call. Dumps,
their triggers and the file format are :mod:`collectives.flight_recorder`'s; :func:`auto_dump`
is what the guard, the crash hook and the engine's waits call: it tells the observers of
``dump`` (:mod:`.observe`), where the flight recorder registers its dumps.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ..observe import OBSERVERS

__all__ = ["Record", "Ring", "failed", "tell_finished", "ENV", "DEFAULT_SIZE", "ring_size", "new_ring", "release_ring",
           "describe",
           "error_text", "auto_dump", "STARTED", "FINISHED", "FAILED"]

#: The number of calls each communicator keeps (0: off).
ENV = "COLLECTIVES_FLIGHT_RECORDER"
DEFAULT_SIZE = 2000

STARTED, FINISHED, FAILED = "started", "finished", "failed"
_ALGORITHMS = "collectives.algorithms."


class Record:
    """One call: its number, kind, description, state, and, once it ended, its end time and (if
    it failed) its error (see the module docstring)."""

    __slots__ = ("seq", "kind", "what", "state", "error", "t1")

    def __init__(self) -> None:
        self.seq = -1
        self.kind = ""
        self.what: tuple | None = None
        self.state = ""
        self.error: str | None = None
        self.t1 = 0.0


class Ring:
    """``size`` preallocated records; call number ``seq`` uses ``records[seq % size]``."""

    __slots__ = ("records", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a flight recorder keeps at least one call, got {size}")
        self.records = [Record() for _ in range(size)]
        self.size = size

    def last(self) -> list[Record]:
        """The records kept, oldest first."""
        return sorted((r for r in self.records if r.seq >= 0), key=lambda r: r.seq)


def ring_size() -> int:
    """N from :data:`ENV` (default :data:`DEFAULT_SIZE`); a bad value falls back to the default
    with one line on stderr: a setting of a debugging aid must not fail the job."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return DEFAULT_SIZE
    try:
        size = int(text)
        if size < 0:
            raise ValueError
    except ValueError:
        print(f"collectives: {ENV}={text!r} is not a number of calls (0 turns the recorder off);"
              f" keeping {DEFAULT_SIZE}", file=sys.stderr, flush=True)
        return DEFAULT_SIZE
    return size


#: rings of closed communicators, reused by the next ones: a program that makes and frees
#: communicators in a loop allocates no new records (tests/mpi/mpi_shm.py's soak checks its memory)
_SPARE: list[Ring] = []
_SPARE_MAX = 8


def new_ring() -> Ring | None:
    """A ring of :func:`ring_size` records (a spare one if there is), or None when the recorder
    is off."""
    size = ring_size()
    if not size:
        return None
    while _SPARE:
        ring = _SPARE.pop()
        if ring.size == size:
            return ring
    return Ring(size)


def release_ring(ring: Ring | None) -> None:
    """Give back the ring of a closed communicator: emptied, kept for :func:`new_ring`."""
    if ring is None or len(_SPARE) >= _SPARE_MAX:
        return
    for record in ring.records:
        record.seq, record.what, record.error = -1, None, None
    _SPARE.append(ring)


def describe(call: Any, name: str | None = None) -> tuple | None:
    """``(name, count, dtype, op, algorithm)`` of a checked call (``AllreduceCall`` ...); the
    parts a call has not are None. ``count`` is the input's, the same on every rank: for
    allgather the gathered total. Never raises: None if the call cannot say."""
    try:
        src = getattr(call, "src", None)
        if src is None:
            src = getattr(call, "buf", None)  # bcast
        elif getattr(call, "kind", None) == "allgather":
            src = call.dst  # the total, the same on every rank (blocks may differ: counts=)
        op = getattr(call, "op", None)
        algorithm = getattr(call, "algorithm", None)
        fn = getattr(call, "fn", None)
        module = getattr(fn, "__module__", None) or ""
        if algorithm == "auto" and module.startswith(_ALGORITHMS) and \
                not module.endswith(".auto"):
            algorithm = f"auto: {module.rsplit('.', 1)[-1]}"  # as resolved
        codec = getattr(call, "codec", None)
        if codec is not None:  # compressed_allreduce: the codec says more than the algorithm
            algorithm = f"{getattr(codec, 'name', type(codec).__name__)}/{algorithm}"
        return (name, None if src is None else int(src.size),
                None if src is None else src.dtype, getattr(op, "name", op), algorithm)
    except Exception:  # noqa: BLE001 - a description must never fail the call
        return None


def failed(rec: Any, exc: BaseException, what: tuple | None, call: Any, observers: tuple,
           name: str, t0: float, seq: int) -> None:
    """A call number ``seq`` ended by ``exc``: its record (``rec``, or None with the recorder
    off) and the observers of ``call`` (``observe.py``) told, as the guard and abort mode's
    runner both tell them."""
    if rec is not None:
        rec.state, rec.t1, rec.error = FAILED, clock(), error_text(exc)
        if what is None and call is not None:
            rec.what = describe(call)
    if observers:
        t1, error = clock(), type(exc).__name__
        for observe in observers:
            observe(name, t0, t1, seq, what, call, error)


def tell_finished(rec: Any, what: tuple | None, call: Any, observers: tuple, name: str,
                  t0: float, seq: int) -> None:
    """A call number ``seq`` ended well: its observers told, with the end and description of
    its record ``rec`` where there is one (its caller ended the record: that is in line, as
    every call does it; this runs only where something observes)."""
    if rec is not None:
        t1, what = rec.t1, rec.what
    else:
        t1 = clock()
    for observe in observers:
        observe(name, t0, t1, seq, what, call, None)


def error_text(exc: BaseException) -> str:
    """``"TypeName: message"`` of ``exc``, on one line; never raises."""
    try:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    except Exception:  # noqa: BLE001 - a str() that fails must not replace the error
        return type(exc).__name__


def auto_dump(reason: str, error: BaseException | None = None) -> None:
    """Ask for a dump of every communicator's records because of ``reason`` ("timeout",
    "stall", "crash", or "argument error": a crash of a bad argument found before any message,
    which the flight recorder dumps only when asked to): the observers of ``dump``
    (:mod:`.observe`; the flight recorder's, registered when :mod:`collectives.flight_recorder`
    is imported, as ``import collectives`` does) write it; never raises."""
    try:
        for observe in OBSERVERS.dump:
            observe(reason, error)
    except Exception as exc:  # noqa: BLE001 - a dump must never hide the original error
        try:
            print(f"collectives: the flight recorder's dump failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001
            pass


#: ``time.perf_counter`` (monotonic), the clock of the records, and of the timeline's spans
#: (``collectives.timeline``), which take a call's end from its record.
clock = time.perf_counter
