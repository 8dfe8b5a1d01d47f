"""The events of one timeline on this process: one lane per thread, appended without a lock.

A :class:`Recorder` keeps one :class:`Lane` per thread that records anything (the caller's
thread, each progress engine's threads, the named stream's). A thread finds its own lane's list
through a ``threading.local`` (``local.events``) and appends ``(category, name, t0, t1, args,
seq)`` tuples to it: a lane has one writer, so the hot path takes no lock (the lock below is
taken once per thread, when its lane is made). Times are ``time.perf_counter()`` seconds, the
flight recorder's clock too (so that a call span can take its end from the call's flight
record); :mod:`.chrome` turns them into trace events.

``args`` is a dict, or for the categories that fill up fastest a tuple that :mod:`.chrome` turns
into one at write time (messages: the peers, then the bytes each was expected to bring; calls:
what the call was), and ``seq`` the call number of a call or request span (else None), so that
recording costs one tuple and an append.
"""

from __future__ import annotations

import threading
from typing import Any

from ..._runtime import flight

__all__ = ["Lane", "Recorder", "clock"]

#: The clock of every event (seconds; one clock for every thread of the process, and the flight
#: recorder's: ``_runtime/flight.py``).
clock = flight.clock


class Lane:
    """The events of one thread, in the order they ended (``tid``: 1, 2, ... in order of the
    threads' first event)."""

    __slots__ = ("tid", "name", "events")

    def __init__(self, tid: int, name: str) -> None:
        self.tid, self.name = tid, name
        self.events: list[tuple[str, str, float, float, Any, int | None]] = []


class Recorder:
    """The lanes of one timeline of this process (see the module docstring)."""

    def __init__(self) -> None:
        self.lanes: list[Lane] = []
        self.local = threading.local()  # .lane, .events: this thread's
        self._lock = threading.Lock()  # taken only to make a lane
        self.started = clock()

    def lane(self) -> Lane:
        """This thread's lane (made at its first event)."""
        try:
            return self.local.lane
        except AttributeError:
            thread = threading.current_thread()
            name = thread.name
            if thread is threading.main_thread():
                name = "caller (main thread)"
            with self._lock:
                lane = Lane(len(self.lanes) + 1, name)
                self.lanes.append(lane)
            self.local.lane, self.local.events = lane, lane.events
            return lane

    def add(self, category: str, name: str, t0: float, t1: float, args: Any = None,
            seq: int | None = None) -> None:
        """One span of this thread, from ``t0`` to ``t1`` (``clock()`` seconds); ``seq``: the
        call number of a call or request span."""
        try:
            events = self.local.events
        except AttributeError:
            events = self.lane().events
        events.append((category, name, t0, t1, args, seq))

    def count(self) -> int:
        """Events recorded so far, all lanes together."""
        return sum(len(lane.events) for lane in self.lanes)
