"""The engine's communicators: MPI's blocking calls, made to wait by polling.

The progress engine runs the same algorithm code as the blocking functions (``comm.Sendrecv``,
``comm.Allreduce`` ...), but on an :class:`EngineComm`: a handle of the engine's private
communicator whose blocking methods start the non-blocking call of MPI (``Isend``/``Irecv``,
``Iallreduce`` ...) and wait for it with a :class:`Waiter`. Three reasons:

- MPI libraries busy-poll inside blocking calls (MPICH and Open MPI both spin a core until the
  message is there). A thread that waits for a slow network that way takes a core away from the
  compute it is meant to overlap with. The waiter spins only for as long as the bytes would take
  on shared memory (:data:`SPIN_S` plus the message size at :data:`SPIN_BYTES_PER_S`), then
  sleeps between polls (20 us doubling up to :data:`MAX_NAP_S`; up to :data:`NATIVE_NAP_S` for
  MPI's own non-blocking collectives, which advance only when tested).
- Between polls the waiter runs ``serve()``: the engine answers other ranks' status queries (the
  stall check) even while it waits inside an operation.
- It can give up: a waiter whose ``stop`` flag is set raises :class:`Stopped` at its next poll
  (shutdown of an engine whose operation can never finish).

The "native" algorithms run under the operation's guard (``collectives._runtime.guard``) as MPI's
non-blocking collectives (``Iallreduce``, ``Ireduce`` ...), waited for by :meth:`Waiter.wait_any`;
the blocking functions run the same non-blocking collectives, so a non-blocking result stays
bitwise identical to the blocking one (MPI does not promise that ``MPI_Iallreduce`` adds in the
same order as ``MPI_Allreduce``, so the two paths must not mix).

Sub-communicators derived from an engine communicator (the node communicators of "hierarchical")
are engine communicators too. The object collectives (lower case: ``allgather``, ``bcast``,
``allreduce``) go through the same waits, as pickled bytes.
"""

from __future__ import annotations

import os
import time
from functools import reduce as fold
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .._runtime.guard import TESTS_BEFORE_YIELD

__all__ = ["Waiter", "Stopped", "EngineComm", "adopt", "SPIN_S", "SPIN_BYTES_PER_S", "MAX_NAP_S",
           "NATIVE_NAP_S"]

#: Every wait spins at least this long before it starts to sleep between polls.
SPIN_S = 100e-6
#: ... plus the time its bytes take at this rate (shared memory is faster; networks are slower).
SPIN_BYTES_PER_S = 1e9
#: The longest sleep between two polls.
MAX_NAP_S = 1e-3
#: ... of an MPI non-blocking collective (``MPI_Iallreduce`` ...), which advances only when it
#: is tested: every step of its schedule waits for the next test, so its naps stay short.
NATIVE_NAP_S = 50e-6
_FIRST_NAP_S = 20e-6
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


class Stopped(Exception):
    """The engine was shut down while an operation waited for messages that never came."""


class Waiter:
    """Waits for MPI requests: spin, then poll with sleeps; serve queries; stop when told."""

    def __init__(self, serve: Callable[[], None] | None = None) -> None:
        self.serve = serve
        self.stop = False
        #: (time.perf_counter() value, function, *arguments): the function called once with the
        #: arguments, between polls, after that time (the stall warning of an operation run by
        #: its wait() on the caller's thread)
        self.alarm: tuple | None = None
        #: test, yielding the processor between tests, and never nap: set while the caller's
        #: thread runs an operation its wait() would only wait for anyway (a nap would add its
        #: length to every step of an MPI non-blocking collective, which advances only in tests)
        self.eager = False

    def check_alarm(self) -> None:
        """Call the alarm's function if its time has passed (once)."""
        alarm = self.alarm
        if alarm is not None and time.perf_counter() > alarm[0]:
            self.alarm = None
            alarm[1](*alarm[2:])

    def wait(self, requests: list[MPI.Request], nbytes: int = 0) -> None:
        """Return when every request has completed."""
        self._poll(lambda: (MPI.Request.Testall(requests), None), nbytes)

    def wait_any(self, requests: list[MPI.Request], status: MPI.Status,
                 native: bool = False) -> int:
        """Return the index of a request that completed (as ``MPI.Request.Waitany``);
        ``native``: one of them is an MPI non-blocking collective (naps of at most
        :data:`NATIVE_NAP_S`)."""
        return self._poll(lambda: MPI.Request.Testany(requests, status)[::-1], 0,
                          NATIVE_NAP_S if native else MAX_NAP_S)

    def _poll(self, test: Callable[[], tuple[bool, Any]], nbytes: int,
              max_nap: float = MAX_NAP_S) -> Any:
        """Call ``test()`` (giving (done, value)) until done: spin, then poll with naps."""
        done, value = test()
        if done:
            return value
        if self.eager:
            return self._eager(test)
        clock = time.perf_counter
        end = clock() + SPIN_S + nbytes / SPIN_BYTES_PER_S
        while clock() < end:
            done, value = test()
            if done:
                return value
        nap = _FIRST_NAP_S
        while True:
            done, value = test()
            if done:
                return value
            self._between_polls()
            time.sleep(nap)
            nap = min(2 * nap, max_nap)

    def _eager(self, test: Callable[[], tuple[bool, Any]]) -> Any:
        """:meth:`_poll` for :attr:`eager`: test (``TESTS_BEFORE_YIELD`` times, then yielding
        between tests: ``guard.eager_tests``); every 64 tests the stop flag, queries and the
        alarm."""
        for _ in range(TESTS_BEFORE_YIELD):
            done, value = test()
            if done:
                return value
        tests = 0
        while True:
            done, value = test()
            if done:
                return value
            _yield()
            tests += 1
            if not tests & 63:
                self._between_polls()

    def _between_polls(self) -> None:
        """The stop flag (raises :class:`Stopped`), other ranks' queries, the alarm."""
        if self.stop:
            raise Stopped("the engine stopped while an operation was waiting for messages")
        if self.serve is not None:
            self.serve()
        if self.alarm is not None:
            self.check_alarm()


def _nbytes(buf: Any) -> int:
    """Bytes of an mpi4py buffer argument (``array`` or ``[array, type, ...]``); 0 if unknown."""
    if isinstance(buf, (list, tuple)):
        buf = buf[0] if buf else None
    return int(getattr(buf, "nbytes", 0) or 0)


class EngineComm(MPI.Intracomm):
    """An intracommunicator whose blocking calls wait through the engine's :class:`Waiter`.

    Create with :func:`adopt`. Only the calls the library's algorithms make are redirected;
    anything else is MPI's own blocking call.
    """

    waiter: Waiter

    # -- point to point ------------------------------------------------------------------------
    def Send(self, buf, dest, tag=0):
        self.waiter.wait([self.Isend(buf, dest, tag)], _nbytes(buf))

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        self.waiter.wait([self.Irecv(buf, source, tag)], _nbytes(buf))

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE,
                 recvtag=MPI.ANY_TAG, status=None):
        recv = self.Irecv(recvbuf, source, recvtag)
        self.waiter.wait([recv, self.Isend(sendbuf, dest, sendtag)],
                         _nbytes(sendbuf) + _nbytes(recvbuf))

    # -- collectives ---------------------------------------------------------------------------
    def Barrier(self):
        self.waiter.wait([self.Ibarrier()])

    def Bcast(self, buf, root=0):
        self.waiter.wait([self.Ibcast(buf, root)], _nbytes(buf))

    def Allgather(self, sendbuf, recvbuf):
        self.waiter.wait([self.Iallgather(sendbuf, recvbuf)], _nbytes(recvbuf))

    def Allgatherv(self, sendbuf, recvbuf):
        self.waiter.wait([self.Iallgatherv(sendbuf, recvbuf)], _nbytes(recvbuf))

    def Alltoall(self, sendbuf, recvbuf):
        self.waiter.wait([self.Ialltoall(sendbuf, recvbuf)], _nbytes(recvbuf))

    # -- object collectives, as pickled bytes ---------------------------------------------------
    def allgather(self, sendobj):
        data = np.frombuffer(MPI.pickle.dumps(sendobj), dtype=np.uint8)
        sizes = np.empty(self.size, dtype=np.int64)
        self.Allgather(np.array([data.size], dtype=np.int64), sizes)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        everything = np.empty(int(offsets[-1]), dtype=np.uint8)
        self.Allgatherv(data, [everything, (sizes, offsets[:-1]), MPI.BYTE])
        return [MPI.pickle.loads(everything[a:b].tobytes())
                for a, b in zip(offsets[:-1], offsets[1:])]

    def bcast(self, obj=None, root=0):
        data = np.frombuffer(MPI.pickle.dumps(obj), dtype=np.uint8) if self.rank == root else None
        size = np.array([0 if data is None else data.size], dtype=np.int64)
        self.Bcast(size, root)
        buf = data.copy() if data is not None else np.empty(int(size[0]), dtype=np.uint8)
        self.Bcast(buf, root)
        return obj if self.rank == root else MPI.pickle.loads(buf.tobytes())

    def allreduce(self, sendobj, op=MPI.SUM):
        return fold(op, self.allgather(sendobj))

    # -- derived communicators stay engine communicators ----------------------------------------
    def Dup(self, info=None):
        return adopt(super().Dup() if info is None else super().Dup(info), self.waiter)

    def Split(self, color=0, key=0):
        return adopt(super().Split(color, key), self.waiter)

    def Split_type(self, split_type, key=0, info=MPI.INFO_NULL):
        return adopt(super().Split_type(split_type, key, info), self.waiter)


def adopt(comm: MPI.Intracomm, waiter: Waiter) -> MPI.Intracomm:
    """An :class:`EngineComm` handle of ``comm`` waiting through ``waiter`` (COMM_NULL stays)."""
    if comm == MPI.COMM_NULL:
        return comm
    handle = EngineComm(comm)
    handle.waiter = waiter
    return handle

