"""The job's id: one name that every rank of the MPI job agrees on, for the flight recorder.

Every rank dumps into a folder of the job's own (``collectives-dump/<job id>/rank-<R>.json``:
:mod:`collectives.flight_recorder`), so that the dumps of two jobs never mix. The ranks agree on
the id without a collective of its own: each guard (:mod:`.guard`) already agrees, once, when it
is made, on the number its calls start at, with one ``MPI_Allreduce(MAX)`` over its
communicator; the id rides in that reduction as a second word. Each rank proposes
:func:`proposal` (the time in seconds and its pid, packed in one int64); the largest proposal is
every rank's, and the first guard whose communicator holds every rank of ``COMM_WORLD`` (the
first call on ``COMM_WORLD``, or on a duplicate of it, as almost every program's first call is)
fixes it for the rest of the process (:func:`agreed`). Nothing is read on the hot path.

The id reads ``YYYYmmdd-HHMMSS-PID`` (local time, and the pid of the rank whose proposal won), so
a folder's job ids sort by the time the job set up its first communicator.

Before such a guard exists (a program whose first calls are on a communicator of some ranks
only), nothing is agreed yet: :func:`job_id` then names the host and the parent process
(``unagreed-<host>-<ppid>``: under a launcher, the ranks of one node share that parent), and a
later agreement does not change an id a dump has used already.
"""

from __future__ import annotations

import os
import socket
import time

from mpi4py import MPI

__all__ = ["proposal", "agreed", "job_id", "name"]

_PID_BITS = 24
#: the agreed proposal, once a guard of every rank agreed (0: not yet)
_AGREED = [0]
#: the id a dump used (then fixed for the process, agreed or not)
_USED: list[str | None] = [None]


def proposal() -> int:
    """This rank's proposal (or the id agreed already, which every rank then proposes): the
    time in seconds and the pid, as one non-negative int64."""
    if _AGREED[0]:
        return _AGREED[0]
    return (int(time.time()) << _PID_BITS) | (os.getpid() & ((1 << _PID_BITS) - 1))


def agreed(comm: MPI.Comm, value: int) -> None:
    """``value``: the largest proposal over ``comm``'s ranks (the guard's reduction); kept as
    the job's id if ``comm`` holds every rank of ``COMM_WORLD`` and none is kept yet."""
    if _AGREED[0] or value <= 0:
        return
    if comm.size == MPI.COMM_WORLD.size and \
            MPI.Comm.Compare(comm, MPI.COMM_WORLD) != MPI.UNEQUAL:
        _AGREED[0] = value


def name(value: int) -> str:
    """The id of the agreed proposal ``value``: ``YYYYmmdd-HHMMSS-PID``."""
    seconds, pid = value >> _PID_BITS, value & ((1 << _PID_BITS) - 1)
    return f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(seconds))}-{pid}"


def job_id() -> str:
    """The job's id (module docstring); the first one a dump uses stays the process's."""
    if _USED[0] is None:
        _USED[0] = name(_AGREED[0]) if _AGREED[0] else \
            f"unagreed-{socket.gethostname()}-{os.getppid()}"
    return _USED[0]
