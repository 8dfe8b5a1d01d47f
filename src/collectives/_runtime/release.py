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

__all__ = ["release", "progress", "finish", "mark_exiting", "pending"]

#: releases still waiting for their exchange or their notices, oldest first
_PENDING: list["_Release"] = []
#: set at exit: communicators are freed at once
_EXITING = [False]
#: set while :func:`progress` runs
_BUSY = [False]
#: messages a release's sweep received (tests account for the messages they leave)
SWEPT = [0]


class _Release:
    """One communicator's release (the module docstring's steps 1-3)."""

    def __init__(self, comm: MPI.Comm, sent: np.ndarray, got: np.ndarray,
                 keep: list[Any]) -> None:
        self.comm, self.got = comm, got.copy()
        self.sent = sent.astype(np.int64)  # kept alive with the request that reads it
        self.owed = np.zeros_like(self.sent)
        self.keep = keep  # this rank's own notice sends: freed only once they complete
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
                for rank, missing in enumerate(self.owed - self.got):
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
        self.comm.Free()


def release(comm: MPI.Comm, guard: Any) -> None:
    """Free ``comm``, the communicator of ``guard`` (closed, or None where none was made), once
    no notice meant for it can still arrive (module docstring)."""
    if guard is None or comm.size == 1 or _EXITING[0] or MPI.Is_finalized():
        comm.Free()
        return
    _PENDING.append(_Release(comm, guard.sent, guard.got, guard.take_outbox()))
    progress()


def progress() -> None:
    """Advance every pending release (free those that are done). Not reentrant: freeing a
    communicator runs its attributes' delete callbacks, which may release another (it joins
    the list, for the next round) but must not step the one being freed again."""
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
