"""Clock alignment across ranks: each rank's offset to rank 0's clock, from a few ping-pongs.

Rank 0 exchanges :data:`ROUNDS` ping-pongs with every other rank in turn: it sends, the other
rank answers with its clock reading ``t_r``, and rank 0 reads its own clock before (``t_0``) and
after (``t_1``). Assuming the two legs take equal time, ``t_r`` was read at ``(t_0 + t_1) / 2``
on rank 0's clock, so the offset is ``t_r - (t_0 + t_1) / 2``, within half the round trip. As
NTP does, the round with the shortest round trip is kept (the one least delayed by the
scheduler or the network). Rank 0 then tells every rank its offset, the round trip and rank 0's
start time, which the timeline's times are counted from.

Cost: ``2 * ROUNDS * (p - 1)`` small messages, in sequence: a few milliseconds at start.
Receives test and yield the processor between tests, as the guard's waits do
(``_runtime/guard.py``): with more ranks than cores a blocking receive would spin out its time
slice, and every round trip would cost scheduler ticks.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from .recorder import clock

__all__ = ["ROUNDS", "align"]

ROUNDS = 8
_TAG = 11
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def _recv(comm: MPI.Comm, buf: np.ndarray, source: int) -> None:
    request = comm.Irecv(buf, source, _TAG)
    while not request.Test():
        _yield()


def align(comm: MPI.Comm) -> tuple[float, float, float]:
    """``(offset, round_trip, origin)`` of this rank, seconds: its clock minus rank 0's, the
    shortest round trip it was measured with (0 on rank 0), and rank 0's clock at the
    alignment (the timeline's zero). Collective over ``comm`` (a private communicator)."""
    buf = np.zeros(3, dtype=np.float64)
    if comm.rank == 0:
        origin = clock()
        for r in range(1, comm.size):
            best, offset = float("inf"), 0.0
            for _ in range(ROUNDS):
                t0 = clock()
                comm.Send(buf[:1], r, _TAG)
                _recv(comm, buf[:1], r)
                t1 = clock()
                if t1 - t0 < best:
                    best, offset = t1 - t0, float(buf[0]) - (t0 + t1) / 2
            comm.Send(np.array([offset, best, origin]), r, _TAG)
        return 0.0, 0.0, origin
    for _ in range(ROUNDS):
        _recv(comm, buf[:1], 0)
        buf[0] = clock()
        comm.Send(buf[:1], 0, _TAG)
    _recv(comm, buf, 0)
    return float(buf[0]), float(buf[1]), float(buf[2])
