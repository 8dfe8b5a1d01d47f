"""A thread that lets one-sided operations aimed at this rank complete while it computes.

MPI's passive-target operations (``MPI_Win_lock``, ``MPI_Put``, ``MPI_Accumulate``) are meant to
complete without the target's help, but most MPI libraries progress them only inside the
target's own MPI calls (MPICH without ``MPIR_CVAR_ASYNC_PROGRESS=1``: a lock on a rank that
sleeps waits until it calls MPI). While a :class:`collectives.Window` or
:class:`collectives.ParameterServer` is open, this thread calls ``MPI_Iprobe`` (which polls the
library's progress engine) every :data:`INTERVAL_S` seconds, so an origin waits at most about
that long for a target that is busy computing. It sleeps between polls (a poll costs a few
microseconds of the GIL) and stops when the last window is freed.
"""

from __future__ import annotations

import threading
import time

from mpi4py import MPI

__all__ = ["hold", "release", "INTERVAL_S"]

#: seconds between two polls of the MPI library's progress engine
INTERVAL_S = 5e-4
_TAG = 32766  # probed for, never sent
_STATE: dict = {"comms": [], "thread": None}
_LOCK = threading.Lock()


def hold(comm: MPI.Comm) -> None:
    """One more open window on ``comm``: start the thread if it is not running."""
    with _LOCK:
        _STATE["comms"].append(comm)
        if _STATE["thread"] is None:
            thread = threading.Thread(target=_poll, name="collectives-rma-progress", daemon=True)
            _STATE["thread"] = thread
            thread.start()


def release(comm: MPI.Comm) -> None:
    """One window on ``comm`` fewer: the thread ends after its next poll once none is left."""
    with _LOCK:
        if comm in _STATE["comms"]:
            _STATE["comms"].remove(comm)


def _poll() -> None:
    while True:
        with _LOCK:
            comms = list(_STATE["comms"])
            if not comms or MPI.Is_finalized():
                _STATE["thread"] = None
                return
        for comm in comms:  # each window's communicator (a library may progress them apart)
            comm.Iprobe(MPI.ANY_SOURCE, _TAG)
        time.sleep(INTERVAL_S)
