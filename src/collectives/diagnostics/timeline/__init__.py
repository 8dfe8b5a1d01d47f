"""A timeline of every collective of every rank, for Perfetto and ``chrome://tracing``.

``COLLECTIVES_TIMELINE=run.json mpiexec -n 4 python train.py``, or in the program::

    collectives.timeline.start("run.json")   # every rank, together
    ...
    collectives.timeline.stop()              # every rank; rank 0 writes run.json

writes one Chrome Trace Event Format file (:mod:`.chrome`): one process per rank, one lane per
thread (the caller's, each progress engine's), a span for each call, submit, wait and engine
run, and inside them the exchange rounds, shared-memory passes, codec work and reductions
(:mod:`.hooks` lists them). Clocks are aligned to rank 0's at the start (:mod:`.clock`).
Guide: docs/timeline.md.

The spans come from observers (:mod:`.hooks`) that :func:`start` registers on the library's
observation points (``observe.py``) and :func:`stop` unregisters. Off (the default)
each point costs one test of an empty tuple; on, each span costs a call of the observer, a
clock read or two and an append to the thread's own list (bench/timeline_overhead.py).

With the environment variable, recording starts when ``collectives`` is imported (a collective
step: every rank imports it) and ends at exit, where each rank writes ``run.rank<R>.json`` and
rank 0 merges them into ``run.json`` (waiting up to :data:`MERGE_WAIT_S` for them; files left
unmerged are merged by ``python -m collectives timeline merge run.rank*.json -o run.json``).
``Options(timeline="run.json")`` starts one from a call instead: the first call made with it
starts the recording over that call's communicator (:func:`start_for_option`), which ends, like
the environment variable's, at :func:`stop` or at exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from mpi4py import MPI

from ... import observe as _observe
from . import hooks
from .chrome import check, document, merge, rank_events, read, write
from .clock import align
from .recorder import Recorder, clock

__all__ = ["start", "start_for_option", "stop", "active", "span", "record", "merge_files", "rank_path", "check",
           "ENV", "MERGE_WAIT_S"]

#: The environment variable that turns the timeline on at import: the file to write.
ENV = "COLLECTIVES_TIMELINE"
#: Seconds rank 0 waits at exit for the other ranks' files before it merges.
MERGE_WAIT_S = 10.0
#: Seconds :func:`start` waits for every rank to start (a rank that never does: TimeoutError).
START_TIMEOUT_S = 60.0


class _Session:
    """One recording: where it goes, on which ranks, with which clock alignment."""

    def __init__(self, path: str, comm: MPI.Comm | None, rank: int, size: int,
                 offset: float, round_trip: float, origin: float) -> None:
        self.path, self.comm, self.rank, self.size = path, comm, rank, size
        self.offset, self.round_trip, self.origin = offset, round_trip, origin
        self.recorder = Recorder()
        self.recorder.lane()  # the caller's thread: lane 1

    def info(self) -> dict:
        return {"rank": self.rank, "size": self.size, "run": self.origin,
                "clock_offset_us": self.offset * 1e6, "round_trip_us": self.round_trip * 1e6}

    def events(self) -> list[dict]:
        return rank_events(self.recorder, self.rank, self.offset, self.origin)


_SESSION: _Session | None = None


def active() -> str | None:
    """The file the timeline in progress will be written to, or None."""
    return None if _SESSION is None else _SESSION.path


def rank_path(path: str | os.PathLike, rank: int) -> str:
    """Where rank ``rank`` writes its own file at exit: ``run.json`` -> ``run.rank3.json``."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix or '.json'}"))


def _duplicate(comm: MPI.Comm, timeout: float) -> MPI.Comm:
    new, request = comm.Idup()
    deadline = time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            raise TimeoutError(f"collectives.timeline.start: timed out after {timeout:g} s "
                               "waiting for every rank to start the timeline (every rank "
                               "calls start(), or imports collectives with "
                               f"{ENV} set)")
        time.sleep(1e-4)
    return new


def start(path: str | os.PathLike, comm: MPI.Comm | None = None) -> None:
    """Start recording, to ``path`` (written by rank 0 at :func:`stop`). Collective over
    ``comm`` (default ``COMM_WORLD``, whose ranks become the timeline's processes): it aligns
    the ranks' clocks (:mod:`.clock`)."""
    global _SESSION
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"timeline path must be a file name, got {path!r}")
    if _SESSION is not None:
        raise RuntimeError(f"a timeline is already recording (to {_SESSION.path}); stop() it "
                           "first")
    comm = MPI.COMM_WORLD if comm is None else comm
    private = _duplicate(comm, START_TIMEOUT_S) if comm.size > 1 else None
    offset, round_trip, origin = align(private) if private is not None else (0.0, 0.0, clock())
    _SESSION = _Session(os.fspath(path), private, comm.rank, comm.size, offset, round_trip,
                        origin)
    hooks.install(_SESSION.recorder)


def stop() -> str | None:
    """Stop recording; rank 0 gathers every rank's events and writes the merged file. Collective
    over the communicator of :func:`start`. Returns the file's path on rank 0, None elsewhere."""
    global _SESSION
    session = _SESSION
    if session is None:
        raise RuntimeError("no timeline is recording")
    hooks.uninstall()
    _SESSION = None
    events, info = session.events(), session.info()
    if session.comm is None:
        write(document(events, [info]), session.path)
        return session.path
    gathered = session.comm.gather((events, info), root=0)
    session.comm.Free()
    if session.rank != 0:
        return None
    write(merge(document(e, [i]) for e, i in gathered), session.path)
    return session.path


def record(name: str, t0: float, t1: float, **args: Any) -> None:
    """A span of the program's own (``"forward"``, ``"update"``) on the calling thread's lane,
    from ``t0`` to ``t1`` (``time.perf_counter()`` seconds), if a timeline is recording; else
    nothing. ``args``: numbers and strings shown with it."""
    rec = hooks.ACTIVE
    if rec is not None:
        rec.add("user", name, t0, t1, args or None)


@contextmanager
def span(name: str, **args: Any) -> Iterator[None]:
    """``with collectives.timeline.span("backward"):`` records the block as a span (see
    :func:`record`)."""
    t0 = clock()
    try:
        yield
    finally:
        record(name, t0, clock(), **args)


def merge_files(paths: list[str | os.PathLike], out: str | os.PathLike) -> dict:
    """Merge rank files (``run.rank*.json``) into ``out``; returns the merged document."""
    doc = merge(read(p) for p in paths)
    write(doc, out)
    return doc


def _at_exit() -> None:
    """A timeline still recording at exit: each rank writes its own file, rank 0 merges."""
    global _SESSION
    session = _SESSION
    if session is None:
        return
    hooks.uninstall()
    _SESSION = None
    doc = document(session.events(), [session.info()])
    if session.size == 1:
        write(doc, session.path)
        return
    write(doc, rank_path(session.path, session.rank))
    if session.rank != 0:
        return
    paths = [rank_path(session.path, r) for r in range(session.size)]
    deadline = time.monotonic() + MERGE_WAIT_S
    ready: set[str] = set()
    while True:
        ready.update(p for p in paths if p not in ready and _same_run(p, session.origin))
        if len(ready) == len(paths) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if len(ready) < len(paths):
        missing = sorted(set(paths) - set(ready))
        print(f"collectives.timeline: {len(missing)} rank file(s) missing after "
              f"{MERGE_WAIT_S:g} s ({missing[0]} ...): merge them later with "
              f"python -m collectives timeline merge {rank_path(session.path, '*')} -o "
              f"{session.path}", file=sys.stderr)
        return
    merge_files(paths, session.path)
    for p in paths:
        os.remove(p)


def _same_run(path: str, run: float) -> bool:
    """Whether ``path`` is a complete rank file of the run that started at ``run``."""
    try:
        return read(path)["otherData"]["ranks"][0]["run"] == run
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return False


#: the files a call's Options.timeline started a recording to (once per file)
_OPTION_FILES: set[str] = set()


def start_for_option(path: str, comm: MPI.Comm) -> None:
    """``Options(timeline=path)`` on a call over ``comm``: start recording to ``path`` over
    ``comm`` (collective, as the call is) unless a timeline is recording or ``path`` was
    started this way before."""
    if _SESSION is None and path not in _OPTION_FILES:
        _OPTION_FILES.add(path)
        start(path, comm)


def start_from_env() -> None:
    """Start a timeline if :data:`ENV` names a file (at import of ``collectives``)."""
    path = os.environ.get(ENV)
    if path and _SESSION is None:
        start(path)


_observe.register("timeline_option", start_for_option)  # Options.timeline (validate.setup)
atexit.register(_at_exit)
