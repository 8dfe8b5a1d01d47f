"""The events of one timeline on this process: one lane per thread, appended without a lock.

A :class:`Recorder` keeps one :class:`Lane` per thread that records anything (the caller's
thread, each progress engine's threads, the named stream's). A thread finds its own lane through
a ``threading.local`` and appends ``(category, name, t0, t1, args)`` tuples to it: a lane has one
writer, so the hot path takes no lock (the lock below is taken once per thread, when its lane is
made). Times are ``time.perf_counter()`` seconds; :mod:`.chrome` turns them into trace events.

``args`` is a dict, or for the categories that fill up fastest a tuple that :mod:`.chrome` turns
into one at write time (messages: ``(peers, expected bytes)``), so that recording costs no more
than a tuple and an append.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["Lane", "Recorder", "clock"]

#: The clock of every event (seconds; one clock for every thread of the process).
clock = time.perf_counter


class Lane:
    """The events of one thread, in the order they ended (``tid``: 1, 2, ... in order of the
    threads' first event)."""

    __slots__ = ("tid", "name", "events")

    def __init__(self, tid: int, name: str) -> None:
        self.tid, self.name = tid, name
        self.events: list[tuple[str, str, float, float, Any]] = []


class Recorder:
    """The lanes of one timeline of this process (see the module docstring)."""

    def __init__(self) -> None:
        self.lanes: list[Lane] = []
        self._local = threading.local()
        self._lock = threading.Lock()  # taken only to make a lane
        self.started = clock()

    def lane(self) -> Lane:
        """This thread's lane (made at its first event)."""
        try:
            return self._local.lane
        except AttributeError:
            thread = threading.current_thread()
            name = thread.name
            if thread is threading.main_thread():
                name = "caller (main thread)"
            with self._lock:
                lane = Lane(len(self.lanes) + 1, name)
                self.lanes.append(lane)
            self._local.lane = lane
            return lane

    def add(self, category: str, name: str, t0: float, t1: float, args: Any = None) -> None:
        """One span of this thread, from ``t0`` to ``t1`` (``clock()`` seconds)."""
        try:
            events = self._local.lane.events
        except AttributeError:
            events = self.lane().events
        events.append((category, name, t0, t1, args))

    def count(self) -> int:
        """Events recorded so far, all lanes together."""
        return sum(len(lane.events) for lane in self.lanes)
