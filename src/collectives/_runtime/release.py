"""Freeing a guard's communicator only once no notice meant for it can still arrive.

MPI gives a freed communicator's context id to the next communicator it makes (MPICH takes the
lowest free one), and a message still queued for the old one then matches the new one's
receives. A failure notice (``_runtime/guard.py``) that reached a rank after that rank withdrew
its notice receive, or a second notice queued behind the first, would wait there for whatever
communicator came next: a user's ``comm.Dup()`` receiving with tag 0, or mpi4py's allreduce of a
Python object (point-to-point messages with tag 0 on a duplicate of its own), which then fails
with MPI_ERR_TRUNCATE. So a guard's communicator is released, not freed:

1. **Counts.** Every guard counts the notices it sent to each rank and those it received from
   each rank. At release the ranks exchange the sent counts (``MPI_Ialltoall``: a collective,
   which no leftover point-to-point message can match), so each rank learns how many notices
   are still on their way to it.
2. **Receive.** It posts a receive for each, then takes whatever else has arrived on the
   communicator (the messages of failed calls whose receives were withdrawn; best effort).
3. **Free.** Only then is the communicator freed.

4. **Park what went different ways.** A context's duplicates for MPI's own collectives (the
   native duplicate, the check duplicate: ``_runtime/context.py``) ride on the same release:
   each rank adds to the exchange how many operations it started on each, and one whose counts
   differ between ranks is *parked*, never freed, until exit. MPI cannot cancel a collective,
   and after a failure a rank that had retired native skipped an operation that a rank not yet
   told had started (``_runtime/guard.py``): that operation's messages then wait, unmatched, in
   the skipping rank's queue under the duplicate's context id. MPICH agrees on a new
   communicator's context id among its members only, so once the skipping ranks freed the
   duplicate, a sub-communicator without the starting rank could get that id, and its
   collective at the same place in its sequence took the old message, truncated to its own
   size, without an error (docs/reliability.md, "Collectives that went different ways"). A
   parked communicator keeps its id on every rank. Where the counts cannot be exchanged apart
   from the operations they count (the progress engine's communicator, hierarchical's
   cross-node ones, the distributed graphs of ``neighbor_allgather``'s "mpi" backend), a
   communicator is parked wherever its guard has retired native
   (:func:`park`); a rank that has not retired started every operation the others did. The
   requests of abandoned operations, with their buffers, are kept until MPI completes them
   (:func:`keep`): a freed landing buffer must never be written.

Nothing here blocks: ``MPI_Comm_free`` is collective, so every rank starts its release at about
the same time and the exchange usually completes at once; where it does not (a rank frees later
than the others), the release waits in :data:`_PENDING`, advanced by every later release and
every new context (:func:`progress`), and finished, or given up, at exit (:func:`finish`). A
communicator whose release can never finish (a rank that never frees it) is freed at exit.

At exit (:func:`mark_exiting`) no communicator is made any more, so nothing can inherit a
context id: communicators are then freed at once, without the exchange.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from .guard import _NOTICE_BYTES, NOTICE_TAG

__all__ = ["release", "progress", "finish", "mark_exiting", "pending", "park", "parked", "keep"]

#: releases still waiting for their exchange or their notices, oldest first
_PENDING: list["_Release"] = []
#: set at exit: communicators are freed at once
_EXITING = [False]
#: set while :func:`progress` runs
_BUSY = [False]
#: messages a release's sweep received (tests account for the messages they leave)
SWEPT = [0]
#: communicators never freed before exit: their MPI collectives went different ways on different
#: ranks (module docstring, step 4)
_PARKED: list[MPI.Comm] = []
#: abandoned operations' requests with what they read and write, until MPI completes them
_KEPT: list[tuple[Any, Any]] = []


class _Release:
    """One communicator's release (the module docstring's steps 1-3)."""

    def __init__(self, comm: MPI.Comm, sent: np.ndarray, got: np.ndarray,
                 keep: list[Any], parts: list[tuple[MPI.Comm, int]],
                 started: tuple[int, int]) -> None:
        self.comm, self.got = comm, got.copy()
        # to each rank: the notices sent to it, and this rank's count of operations started on
        # each part (kept alive with the request that reads it)
        self.sent = np.empty((comm.size, 3), dtype=np.int64)
        self.sent[:, 0] = sent
        self.sent[:, 1:] = started
        self.owed = np.zeros_like(self.sent)
        self.keep = keep  # this rank's own notice sends: freed only once they complete
        self.parts, self.started = parts, started
        self.exchange = comm.Ialltoall([self.sent, MPI.INT64_T], [self.owed, MPI.INT64_T])
        self.receives: list[Any] | None = None
        self.boxes: list[np.ndarray] = []
        self.failed = False

    def step(self) -> bool:
        """Advance without blocking; True once the communicator is freed."""
        if self.failed:
            return False
        try:
            if self.receives is None:
                if not self.exchange.Test():
                    return False
                self.receives = []
                for rank, missing in enumerate(self.owed[:, 0] - self.got):
                    for _ in range(max(0, int(missing))):
                        box = np.empty(_NOTICE_BYTES, dtype=np.uint8)
                        self.boxes.append(box)
                        self.receives.append(self.comm.Irecv([box, MPI.BYTE], rank, NOTICE_TAG))
            if self.receives and not MPI.Request.Testall(self.receives):
                return False
            self._sweep()
            if self.keep and not MPI.Request.Testall(self.keep):
                return False
        except MPI.Exception:  # (a collective of another kind matched the exchange: the
            self.failed = True  # communicator's collectives were out of step) left to exit
            return False
        for part, k in self.parts:  # step 4: the same count everywhere, or parked
            if (self.owed[:, 1 + k] == self.started[k]).all():
                part.Free()
            else:
                park(part)
        self.comm.Free()
        return True

    def _sweep(self) -> None:
        """Receive whatever else has arrived (every rank has released, so nothing more is
        sent on the communicator, but a failed call's message may still be queued)."""
        status = MPI.Status()
        while True:
            message = self.comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            if message is None:
                return
            message.Recv([np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8), MPI.BYTE])
            SWEPT[0] += 1

    def abandon(self) -> None:
        """Free the communicator without waiting any more (exit)."""
        for req in self.receives or []:
            if req != MPI.REQUEST_NULL and not req.Test():
                req.Cancel()
        for part, _ in self.parts:
            part.Free()
        self.comm.Free()


def release(comm: MPI.Comm, guard: Any, native: MPI.Comm | None = None,
            control: MPI.Comm | None = None, started: tuple[int, int] = (0, 0)) -> None:
    """Free ``comm``, the communicator of ``guard`` (closed, or None where none was made), once
    no notice meant for it can still arrive; with it ``native`` and ``control``, the context's
    duplicates on which it started ``started`` operations (MPI's own collectives, signature
    checks), each parked instead where another rank started another number (module
    docstring)."""
    parts = [(c, k) for k, c in enumerate((native, control)) if c is not None]
    if guard is None or comm.size == 1 or _EXITING[0] or MPI.Is_finalized():
        for part, _ in parts:
            part.Free()
        comm.Free()
        return
    _PENDING.append(_Release(comm, guard.sent, guard.got, guard.take_outbox(), parts,
                             (int(started[0]), int(started[1]))))
    progress()


def park(comm: MPI.Comm) -> None:
    """Keep ``comm`` allocated until exit instead of freeing it: its MPI collectives may have
    gone different ways on different ranks (module docstring, step 4). At exit, freed."""
    if _EXITING[0] or MPI.Is_finalized():
        comm.Free()
        return
    _PARKED.append(comm)


def parked() -> int:
    """How many communicators are parked (tests)."""
    return len(_PARKED)


def keep(dangling: list[tuple[Any, Any]]) -> None:
    """Keep abandoned operations' ``(request, buffers)`` referenced until MPI completes them
    (a closed guard's ``dangling``): MPI may still write the buffers."""
    _KEPT.extend(d for d in dangling if not d[0].Test())


def progress() -> None:
    """Advance every pending release (free those that are done). Not reentrant: freeing a
    communicator runs its attributes' delete callbacks, which may release another (it joins
    the list, for the next round) but must not step the one being freed again."""
    if _KEPT:
        _KEPT[:] = [d for d in _KEPT if not d[0].Test()]
    if _BUSY[0] or not _PENDING:
        return
    _BUSY[0] = True
    try:
        todo = _PENDING[:]
        del _PENDING[:]
        _PENDING[:0] = [r for r in todo if not r.step()]
    finally:
        _BUSY[0] = False


def pending() -> int:
    """How many communicators wait for their release (tests)."""
    return len(_PENDING)


def mark_exiting() -> None:
    """From now on communicators are freed at once (:data:`_EXITING`)."""
    _EXITING[0] = True


def finish(wait_s: float = 2.0) -> None:
    """At exit: let the pending releases finish for up to ``wait_s`` seconds (the other ranks
    are exiting too, and advance theirs), then free what is left."""
    mark_exiting()
    deadline = time.monotonic() + wait_s
    while _PENDING and not MPI.Is_finalized():
        progress()
        if not _PENDING or time.monotonic() > deadline or all(r.failed for r in _PENDING):
            break
        time.sleep(1e-3)
    for r in _PENDING:
        if not MPI.Is_finalized():
            r.abandon()
    _PENDING.clear()
    for comm in _PARKED:  # no communicator is made any more: no id can be taken again
        if not MPI.Is_finalized():
            comm.Free()
    _PARKED.clear()
    _KEPT.clear()
