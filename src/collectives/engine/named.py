"""Named operations: ranks may submit them in different orders; the engines agree on one.

In the spirit of Horovod's coordinator. Operations submitted with ``name=`` do not join the
communicator's ordered queue; they go to its *named stream*: a second thread with its own private
duplicate, which negotiates in rounds. A round is one allgather, among the named streams of all
ranks, of every rank's list of submitted and not yet run names (each with its kind, signature
and any local argument error, in local submission order). Every rank sees the same lists, so
every rank computes the same decision: the names present on every rank run now, one after the
other, in the order of rank 0's list; the others wait for a later round.

- A stream whose rank has nothing pending sleeps (no MPI calls); a rank that submits starts a
  round, which waits for every rank to start one too (each will: every name must be submitted
  everywhere). While some rank still has names the others lack, all keep going round by round,
  sleeping :data:`BACKOFF_S` between rounds that ran nothing, like Horovod's cycle time.
- The same name with different arguments (kind, count, dtype, op ...) or a local argument error
  is reported from that request's ``wait()`` with the same error on every rank.
- The last round says which ranks have not submitted a name: that is what a stall report or a
  ``TimeoutError`` for a named request says.

Named and ordered operations of one communicator progress independently (two threads, two
duplicates); a name may be reused once its operation has run.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from mpi4py import MPI

from .._runtime.context import Context
from .._runtime.flight import describe
from .._runtime.validate import local_error, verdict
from .comm import Stopped, Waiter, adopt
from .requests import EngineError, Request

__all__ = ["NamedStream", "BACKOFF_S"]

#: Pause between negotiation rounds that ran nothing.
BACKOFF_S = 1e-3


class NamedStream:
    """The named operations of one communicator (see the module docstring)."""

    def __init__(self, label: str, rank: int, size: int, comm: MPI.Intracomm,
                 waiter: Waiter) -> None:
        self.label, self.rank, self.size = label, rank, size
        self.waiter = waiter
        self.comm = adopt(comm, waiter)
        self.ctx = Context(self.comm, dup=False)
        self._pending: dict[str, Request] = {}   # local submission order
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.submitted = self.completed = 0
        self.missing: dict[str, list[int]] = {}  # name -> ranks without it, at the last round
        self.failure: tuple[str, BaseException] | None = None
        self.running = False

    @property
    def pending(self) -> int:
        return len(self._pending) + self.running

    @property
    def thread(self) -> threading.Thread | None:
        """The stream's thread, started by the first named operation (None before)."""
        return self._thread

    def outstanding(self) -> list[Request]:
        with self._cond:
            return list(self._pending.values())

    def submit(self, request: Request) -> Request:
        with self._cond:
            if self._stop:
                raise EngineError(f"the engine of {self.label} is shut down")
            if request.name in self._pending:
                raise ValueError(f"an operation named {request.name!r} is already pending on "
                                 f"{self.label}; names must be unique among pending operations")
            request.seq = self.submitted
            self.submitted += 1
            self._pending[request.name] = request
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"collectives-named {self.label}")
                self._thread.start()
        return request

    def report(self, request: Request, idle: list[int]) -> str:
        """Why ``request`` has not run; ``idle``: ranks with no named operation pending."""
        missing = self.missing.get(request.name) or idle
        what = f"{request.describe()} on {self.label}"
        if missing:
            return f"{what}: rank(s) {', '.join(map(str, missing))} have not submitted it"
        return f"{what}: every rank has submitted it; it runs at the next negotiation round"

    def stop(self) -> None:
        """Tell the thread to end once nothing is pending (the engine joins it)."""
        with self._cond:
            self._stop = True
            self._cond.notify()

    # -- the thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            going = False
            while True:
                with self._cond:
                    while not self._pending and not going and not self._stop:
                        self._cond.wait()
                    if self._stop and not self._pending:
                        return
                    mine = [self._entry(r) for r in self._pending.values()]
                everyone = self.comm.allgather(mine)
                ran = self._decide(everyone)
                going = any(self._left(everyone, ran))  # the same verdict on every rank
                if going and not ran:
                    time.sleep(BACKOFF_S)
        except Stopped:
            with self._cond:
                left, self._pending = list(self._pending.values()), {}
            for request in left:
                request.complete(EngineError(f"the engine of {self.label} was shut down"))

    @staticmethod
    def _entry(request: Request) -> tuple[str, str, Any, Any]:
        error = None if request.local_error is None else local_error(request.local_error)
        sig = None if request.call is None else request.call.signature()
        return request.name, request.kind, sig, error

    @staticmethod
    def _left(everyone: list, ran: list[str]) -> list[list]:
        return [[e for e in entries if e[0] not in ran] for entries in everyone]

    def _decide(self, everyone: list) -> list[str]:
        """Run the names every rank has, in rank 0's order; return them."""
        names = [set(e[0] for e in entries) for entries in everyone]
        common = [e[0] for e in everyone[0] if all(e[0] in n for n in names)]
        for name in common:
            entries = [next(e for e in es if e[0] == name) for es in everyone]
            with self._cond:
                request = self._pending[name]
                self.running = True
            error = self._agree(name, entries)
            if error is None:
                error = self._run(request)
            with self._cond:
                del self._pending[name]
                self.running = False
                self.completed += 1
            request.complete(error)
        ran = set(common)
        self.missing = {e[0]: [r for r in range(self.size) if e[0] not in names[r]]
                        for entries in everyone for e in entries if e[0] not in ran}
        return common

    def _agree(self, name: str, entries: list) -> Exception | None:
        kinds = [kind for _, kind, _, _ in entries]
        if len(set(kinds)) > 1:
            return ValueError(f"operation {name!r} on {self.label}: the ranks submitted different "
                              "operations under one name ("
                              + ", ".join(f"rank {r}: {k}" for r, k in enumerate(kinds)) + ")")
        return verdict(f"{kinds[0]} {name!r}", [(sig, err) for _, _, sig, err in entries])

    def _run(self, request: Request) -> BaseException | None:
        if self.failure is not None:
            what, exc = self.failure
            return EngineError(f"{request.describe()} was not run: {what} failed on this rank "
                               f"({type(exc).__name__}: {exc}); use a new communicator")
        request.started = time.perf_counter()
        try:
            self.ctx.guard.run(request.kind, request.call.run, self.ctx, call=request.call,
                               what=describe(request.call, request.name))
        except Stopped:
            raise
        except Exception as exc:  # noqa: BLE001 - reported by the request's wait()
            self.failure = (request.describe(), exc)
            return exc
        finally:
            request.finished = time.perf_counter()
        return None
