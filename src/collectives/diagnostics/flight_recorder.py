"""Dumps of the flight recorder: what every communicator of this rank did last, one file per rank.

Every communicator keeps its last calls in a ring (:mod:`collectives._runtime.flight`;
``COLLECTIVES_FLIGHT_RECORDER=N``, default 2000, 0 off). A dump writes them, with what the
running call waits for, to ``<job id>/rank-<R>.json`` (R: the rank in ``COMM_WORLD``; the job's
id, the same on every rank of the job: :mod:`collectives._runtime.job`) in
``COLLECTIVES_DUMP_DIR`` (default :data:`DEFAULT_DIR`, under the working directory: on a cluster
usually a shared file system, so that ``python -m collectives doctor`` finds every rank's file
in one place; each job's in a folder of its own, so that a later job's dumps never mix with an
earlier one's). A rank dumps:

- when a call times out (``Options.timeout``), on the rank whose deadline passed and on every
  rank its notice reaches; when a non-blocking wait times out or its stall warning fires
  (``Options.stall_warning``);
- on an unhandled exception (the crash hook of :mod:`collectives._runtime.crash`), before the job
  ends; not for a bad argument that a call's checks found before it sent anything (reason
  "argument error": the traceback says all the dump would), unless
  ``COLLECTIVES_DUMP_ON_ARGUMENT_ERROR=1`` (:data:`ARGUMENT_ERROR_ENV`) asks for it;
- on ``SIGUSR1`` (``kill -USR1 <pid>``), when :func:`install_signal` could install its handler:
  ``import collectives`` does, from the main thread, where no handler of the user's is there;
  Python runs it between bytecodes of the main thread, so a rank inside the library's waits (which
  poll) or in Python code answers, one blocked inside a plain MPI call does not;
- when asked: :func:`dump`.

The automatic dumps (timeouts, stalls, the crash hook) write only when this process has not
dumped in the last :data:`QUIET_S` seconds, so the file keeps the state of the first hang, not
of the errors that follow it; :func:`dump` and the signal always write. A dump never raises: a
file that cannot be written is one line on stderr. Where the dumps went is said once per job,
not once per rank: by the first rank whose automatic dump creates the job folder's marker
(:data:`MARKER`).

Point-to-point messages (``collectives.send``, ``recv``, ``sendrecv``, ``isend``, ``irecv``) are
not collective and have no guard: the recorder keeps the last N of this process in a ring of
its own, told by the observation point ``pt2pt`` (``observe.py``: each message's start and end,
:func:`_pt2pt`), registered at import while the recorder is on.

The file is JSON: ``job``, ``rank``, ``size``, ``host``, ``pid``, ``reason``, ``error``,
``time`` (wall clock), and per communicator its identity (``id``, the same on every rank: its ``role``,
"blocking", "engine" or "named", its place among the communicators over the same ranks that the
thread made, and ``members``, its ranks in ``COMM_WORLD``), its current call number ``seq``,
whether a call is running (``active``) and whom its last wait waited for (``waiting_for``), and
its ``records``, oldest first (``seq``, ``kind``, ``name``, ``count``, ``dtype``, ``bytes``,
``op``, ``algorithm``, ``state``, ``error``, ``end``, and ``start`` for a running call under a
deadline); per progress engine, its operations submitted and not finished (``outstanding``);
and ``pt2pt``: the number of point-to-point messages so far (``seq``) and the last ones'
``records``, oldest first (``seq``, ``kind``, ``side`` "send" or "recv", ``peer`` as a rank of
``COMM_WORLD`` (-1: any rank; None: its communicator is gone), ``peer_in_comm``,
``comm_size``, ``tag`` (-1: any tag), ``bytes``, ``dtype``, ``state``, ``error`` (the error's
type), ``start``, ``end``). The format is described for users in docs/debugging.md.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from .._runtime import flight
from .._runtime.cli import say
from .._runtime.job import job_id
from .. import observe as _observe
from .._runtime.guard import Guard, live_guards
from ..engine.lifecycle import live_engines

__all__ = ["dump", "snapshot", "install_signal", "DIR_ENV", "DEFAULT_DIR", "QUIET_S", "FORMAT",
           "ARGUMENT_ERROR_ENV", "MARKER", "P2P"]

#: Where dumps go (each job's into a folder of its own, named by the job's id).
DIR_ENV = "COLLECTIVES_DUMP_DIR"
DEFAULT_DIR = "collectives-dump"
#: Set to 1 to dump on an unhandled bad argument too (found before the call sent anything).
ARGUMENT_ERROR_ENV = "COLLECTIVES_DUMP_ON_ARGUMENT_ERROR"
#: The file in a job's folder whose creation tells the one rank that says where the dumps are.
MARKER = ".announced"
#: Automatic dumps of one process are at least this many seconds apart.
QUIET_S = 60.0
FORMAT = "collectives-flight-recorder/1"

_last_auto = [float("-inf")]
_serial = itertools.count()
_lock = threading.Lock()


def _world() -> tuple[int, int]:
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return 0, 1
    return MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size


def dump(directory: str | os.PathLike | None = None, reason: str = "request",
         error: BaseException | None = None) -> Path | None:
    """Write this rank's dump to ``directory`` (default ``COLLECTIVES_DUMP_DIR``, else
    :data:`DEFAULT_DIR`) as ``<job id>/rank-<R>.json``; return its path, or None if it could not
    be written (said in one line on stderr). Not collective: every rank dumps on its own."""
    rank, _ = _world()
    where = Path(directory or os.environ.get(DIR_ENV) or DEFAULT_DIR) / job_id()
    _last_auto[0] = time.monotonic()  # the automatic dumps that follow keep this one
    try:
        text = json.dumps(snapshot(reason, error), indent=None, separators=(",", ":"))
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"rank-{rank}.json"
        tmp = where / f".rank-{rank}.json.{os.getpid()}.{next(_serial)}"  # one per writer
        tmp.write_text(text + "\n")
        os.replace(tmp, path)  # whole or not at all, for a doctor reading at the same time
    except Exception as exc:  # noqa: BLE001 - a dump must never fail the job
        say(f"collectives: rank {rank}: the flight recorder could not write its dump to "
            f"{where}: {type(exc).__name__}: {' '.join(str(exc).split())}\n")
        return None
    return path


def auto(reason: str, error: BaseException | None = None) -> None:
    """An automatic dump (a timeout, a stall warning, the crash hook): at most one per
    :data:`QUIET_S` seconds, none while the recorder is off, none for an "argument error"
    unless :data:`ARGUMENT_ERROR_ENV` asks, and, from the job's first rank to dump, one line on
    stderr saying where every rank's dump goes."""
    asked = os.environ.get(ARGUMENT_ERROR_ENV, "").strip().lower() in ("1", "yes", "on", "true")
    if reason == "argument error" and not asked:
        return
    if not (live_guards() or P2P.seq) or flight.ring_size() == 0 or \
            not _lock.acquire(blocking=False):
        return  # nothing recorded yet, the recorder is off, or another thread is dumping
    try:
        now = time.monotonic()
        if now - _last_auto[0] < QUIET_S:
            return
        path = dump(reason=reason, error=error)
    finally:
        _lock.release()
    if path is not None and _first(path.parent):
        rank, _ = _world()
        say(f"collectives: rank {rank}: flight recorder dumped ({reason}) to {path.parent}/, "
            "with every rank's dump of this job; explain with: python -m collectives doctor "
            f"{path.parent}\n")


def _first(folder: Path) -> bool:
    """Whether this process is the first to say where the job's dumps go (it made
    :data:`MARKER` in the job's folder; on a file system that cannot say, True)."""
    try:
        os.close(os.open(folder / MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def snapshot(reason: str = "request", error: BaseException | None = None) -> dict[str, Any]:
    """This rank's dump as a dict (what :func:`dump` writes)."""
    rank, size = _world()
    offset = time.time() - flight.clock()  # the records' clock -> wall clock
    roles = _roles()
    comms = []
    for guard in sorted(live_guards(), key=lambda g: (g.members, g.ordinal)):
        comms.append(_communicator(guard, roles.get(id(guard), "blocking"), offset))
    return {"format": FORMAT, "job": job_id(), "rank": rank, "size": size,
            "host": socket.gethostname(),
            "pid": os.getpid(), "reason": reason, "thread": threading.current_thread().name,
            "error": None if error is None else flight.error_text(error),
            "time": time.time(), "recorder": flight.ring_size(), "communicators": comms,
            "engines": _engines(), "pt2pt": P2P.snapshot(offset)}


def _roles() -> dict[int, str]:
    """id(guard) -> "engine" or "named" for the guards of the progress engines."""
    roles: dict[int, str] = {}
    for engine in live_engines():
        for ctx, role in ((engine.ctx, "engine"), (engine.named.ctx, "named")):
            if ctx._guard is not None:
                roles[id(ctx._guard)] = role
    return roles


def _communicator(guard: Guard, role: str, offset: float) -> dict[str, Any]:
    ring = guard.ring
    records = [] if ring is None else [_record(r, offset) for r in ring.last()]
    running = guard.owner.active is guard
    if running and records and records[-1]["seq"] == guard.seq and records[-1]["count"] is None \
            and guard.call is not None:  # the running call's description, from its arguments
        records[-1].update(_what(flight.describe(guard.call)))
    if running and records and records[-1]["seq"] == guard.seq and guard.deadline is not None:
        records[-1]["start"] = guard.deadline - guard.timeout + offset
    members = guard.members
    waiting = None
    waits = guard.waits
    if running and waits is not None and waits[0] == guard.seq:
        waiting = sorted({members[p] if 0 <= p < len(members) else p for p in waits[1]})
        waiting = "all" if waiting == [-1] else waiting  # a native collective: every rank
    return {"id": f"{role} {guard.ordinal} of ranks {_span(members)}", "members": members,
            "role": role, "first": guard.first, "rank": guard.rank,
            "size": guard.size, "seq": guard.seq, "active": running, "waiting_for": waiting,
            "retired": guard.retired, "records": records}


def _span(ranks: list[int]) -> str:
    """``0-3`` for 0, 1, 2, 3; else the ranks with commas."""
    if ranks and ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ",".join(map(str, ranks))


def _what(what: tuple | None) -> dict[str, Any]:
    if what is None:
        return {"name": None, "count": None, "dtype": None, "bytes": None, "op": None,
                "algorithm": None}
    name, count, dtype, op, algorithm = what
    nbytes = None
    if count is not None and dtype is not None:
        nbytes = int(count) * int(np.dtype(dtype).itemsize)
    return {"name": name, "count": count, "dtype": None if dtype is None else str(dtype),
            "bytes": nbytes, "op": op, "algorithm": algorithm}


def _record(rec: flight.Record, offset: float) -> dict[str, Any]:
    ended = rec.state != flight.STARTED
    out = {"seq": rec.seq, "kind": rec.kind, "state": rec.state,
           "error": rec.error if rec.state == flight.FAILED else None, "start": None,
           "end": rec.t1 + offset if ended else None}
    out.update(_what(rec.what))
    return out


def _engines() -> list[dict[str, Any]]:
    """Per engine: its operations submitted and not finished. Read without the engine's locks
    (the signal handler may run on a thread that holds one); a list that changes meanwhile is
    skipped."""
    out = []
    for engine in live_engines():
        try:
            ordered = [engine._outstanding[k] for k in sorted(list(engine._outstanding))]
            ordered += list(engine.named._pending.values())
            pending = [{"kind": r.kind, "name": r.name, "seq": r.seq,
                        "state": "started" if r.started is not None else "submitted",
                        "description": r.describe()} for r in ordered if not r.test()]
        except Exception:  # noqa: BLE001 - changed while read
            pending = None
        out.append({"label": engine.label, "submitted": engine.submitted,
                    "completed": engine.completed, "running": engine.running,
                    "outstanding": pending})
    return out


# -- point-to-point ---------------------------------------------------------------------------------
class P2PRing:
    """The last ``size`` point-to-point messages of this process: message ``seq``'s start in
    ``starts[seq % size]`` and its end in ``ends[seq % size]``, tuples made at once (no record
    object is touched again). A message's op carries what is kept of it, made once
    (``envelope``: side, communicator, peer, tag, bytes, dtype code), and the number of its
    current message (``seq``), so that a start is one tuple and an end another."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.starts: list[tuple | None] = [None] * self.size
        self.ends: list[tuple | None] = [None] * self.size
        self.seq = 0
        self._counter = itertools.count(1)

    def observe(self, kind: str, op: Any, t0: float, t1: float | None,
                error: str | None) -> None:
        """The observer of ``pt2pt``: a message's start, then its end."""
        if t1 is None:
            seq = self.seq = op.seq = next(self._counter)
            self.starts[seq % self.size] = (seq, kind, op.envelope, t0)
            return
        seq = op.seq
        if seq:  # (0: its start was not observed)
            self.ends[seq % self.size] = (seq, t1, error)
            op.seq = 0

    def snapshot(self, offset: float) -> dict[str, Any]:
        """The ``pt2pt`` part of a dump (the module docstring); ``offset``: clock to wall time."""
        from ..pt2pt.messages import dtype_name

        worlds: dict[int, Any] = {}
        out = []
        for start in sorted((s for s in self.starts if s is not None), key=lambda s: s[0]):
            seq, kind, (side, comm, peer, tag, nbytes, code), t0 = start
            end = self.ends[seq % self.size]
            t1, error = (end[1], end[2]) if end is not None and end[0] == seq else (None, None)
            state = flight.STARTED if t1 is None else \
                (flight.FINISHED if error is None else flight.FAILED)
            out.append({"seq": seq, "kind": kind, "side": side,
                        "peer": _world_rank(comm, peer, worlds), "peer_in_comm": peer,
                        "comm_size": _size_of(comm), "tag": tag, "bytes": nbytes,
                        "dtype": dtype_name(code), "state": state, "error": error,
                        "start": t0 + offset, "end": None if t1 is None else t1 + offset})
        return {"seq": self.seq, "records": out}


def _size_of(comm: Any) -> int | None:
    try:
        return comm.size
    except Exception:  # noqa: BLE001 - freed
        return None


def _world_rank(comm: Any, peer: int, cache: dict[int, Any]) -> int | None:
    """``peer`` of ``comm`` as a rank of ``COMM_WORLD`` (negative ones, ANY_SOURCE and
    PROC_NULL, as -1); None when ``comm`` has been freed since."""
    if peer < 0:
        return -1
    ranks = cache.get(id(comm))
    if ranks is None:
        try:
            group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
            try:
                ranks = MPI.Group.Translate_ranks(group, list(range(group.size)), world)
            finally:
                group.Free()
                world.Free()
        except Exception:  # noqa: BLE001 - freed, or not an intracommunicator
            ranks = []
        cache[id(comm)] = ranks
    return int(ranks[peer]) if peer < len(ranks) else None


#: This process's point-to-point messages (what the dumps' ``pt2pt`` holds).
P2P = P2PRing(flight.ring_size())

_observe.register("dump", auto)  # timeouts, stalls and crashes dump (flight.auto_dump)
if flight.ring_size():
    _observe.register("pt2pt", P2P.observe)  # every point-to-point message, while on


def install_signal(signum: int = getattr(signal, "SIGUSR1", 0)) -> bool:
    """Dump on ``signum`` (SIGUSR1): installed only from the main thread, only where the
    signal still has its default disposition (a handler of the user's stays), only while the
    recorder is on. True if installed."""
    if not signum or flight.ring_size() == 0 \
            or threading.current_thread() is not threading.main_thread():
        return False
    try:
        if signal.getsignal(signum) is not signal.SIG_DFL:
            return False
        signal.signal(signum, _on_signal)
    except (ValueError, OSError):  # pragma: no cover - not allowed here
        return False
    return True


def _on_signal(signum: int, frame: Any) -> None:
    path = dump(reason="signal")
    if path is not None:
        rank, _ = _world()
        say(f"collectives: rank {rank}: flight recorder dumped to {path} (signal {signum})\n")
