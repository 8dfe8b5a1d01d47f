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

Beyond the library's own non-blocking calls, the stream runs any *call object* handed to
:func:`~.calls.submit` (``signature()``, ``run(ctx)``; the Horovod layer's operations, which
:mod:`collectives.torch` submits this way), and *joins* (:func:`~.calls.join`, Horovod's
``hvd.join``):

- A call with an ``agree`` rule (a module-level function, sent with its signature: every rank's
  signature in, the error every rank raises out) agrees by it instead of needing equal
  signatures; a call with ``agreed(signatures)``
  hears every rank's signature before it runs (an allgather whose first dimensions differ
  learns them there).
- A rank with a join pending has *joined*: a name that every other rank has submitted runs, and
  each joined rank *stands in*: its join's ``stand_in(kind, signature)`` makes a call that takes
  part (zeros in a sum), given the signature of the lowest rank that has the name. A kind that
  a joined rank does not stand in for (its join's ``kinds``) fails on the ranks that submitted
  it with a ``RuntimeError``. Once every rank has joined, every join completes; its result is
  the highest of the ranks that joined last (the round in which each rank's join first appeared
  decides, and every rank sees the same rounds), and the automatic names (:meth:`automatic`,
  for call objects submitted without a name) start again from ``noname.0``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from mpi4py import MPI

from .._runtime.context import Context
from .._runtime.flight import describe
from .._runtime.validate import local_error, verdict
from .comm import Stopped, Waiter, adopt
from .requests import EngineError, Request

__all__ = ["NamedStream", "BACKOFF_S", "JOIN", "JoinCall"]

#: Pause between negotiation rounds that ran nothing.
BACKOFF_S = 1e-3

#: The name (and kind) of a join: a rank with one pending has joined (see the module); no
#: name a caller would choose.
JOIN = "<join>"

class JoinCall:
    """A join's call: which kinds the rank stands in for, and how (``stand_in(kind, sig)``
    returns a call object to run in the others' operation); ``result`` the rank that joined
    last, once every rank has joined."""

    kind = JOIN
    trivial = False

    def __init__(self, stand_in: Callable[[str, Any], Any] | None, kinds: tuple) -> None:
        self.stand_in, self.kinds, self.result = stand_in, tuple(kinds), None

    def signature(self) -> dict[str, Any]:
        return {"stands_in": self.kinds}

    def run(self, ctx: Any) -> None:
        pass


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
        self.rounds = 0                          # negotiation rounds so far (the same everywhere)
        self._auto = 0                           # the next automatic name's number
        self._joined_at: dict[int, int] = {}     # joined rank -> the round its join appeared

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

    def automatic(self) -> str:
        """The next automatic name (``noname.0``, ``noname.1`` ...): unnamed call objects match
        in submission order; numbered from 0 again once every rank has joined."""
        with self._cond:
            k, self._auto = self._auto, self._auto + 1
        return f"noname.{k}"

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
    def _entry(request: Request) -> tuple[str, str, Any, Any, Any]:
        """``(name, kind, signature, local error, agreement rule)``: what the others hear."""
        error = None if request.local_error is None else local_error(request.local_error)
        call = request.call
        sig = None if call is None else call.signature()
        return request.name, request.kind, sig, error, getattr(call, "agree", None)

    @staticmethod
    def _left(everyone: list, ran: list[str]) -> list[list]:
        return [[e for e in entries if e[0] not in ran] for entries in everyone]

    def _decide(self, everyone: list) -> list[str]:
        """Run the names every rank has (or has joined without), every rank's names in rank
        order (rank 0's order when rank 0 has them); complete the joins once every rank has
        joined. Returns the names run."""
        self.rounds += 1
        have = [{e[0]: e for e in entries} for entries in everyone]
        joined = {r: h[JOIN] for r, h in enumerate(have) if JOIN in h}
        for r in joined:
            self._joined_at.setdefault(r, self.rounds)
        order = dict.fromkeys(e[0] for entries in everyone for e in entries if e[0] != JOIN)
        ready = [n for n in order if all(n in h or r in joined for r, h in enumerate(have))]
        for name in ready:
            self._one(name, [h.get(name) for h in have], joined)
        if len(joined) == self.size:
            self._joins_done()
            ready.append(JOIN)
        ran = set(ready)
        self.missing = {e[0]: [r for r in range(self.size)
                               if e[0] not in have[r] and (r not in joined or e[0] == JOIN)]
                        for entries in everyone for e in entries if e[0] not in ran}
        return ready

    def _one(self, name: str, entries: list, joined: dict) -> None:
        """Run ``name``: ``entries`` every rank's entry, None where a joined rank stands in."""
        active = [e for e in entries if e is not None]
        error = self._agree(name, active)
        kind = active[0][1]
        standing = [r for r, e in enumerate(entries) if e is None]
        refused = [r for r in standing if kind not in joined[r][2]["stands_in"]]
        if error is None and refused:
            kinds = ", ".join(joined[refused[0]][2]["stands_in"]) or "no operation"
            error = RuntimeError(f"{kind} {name!r} on {self.label}: rank(s) "
                                 f"{', '.join(map(str, refused))} have joined, and a joined rank "
                                 f"takes part only in {kinds}")
        with self._cond:
            request = self._pending.get(name)
            join = None if request is not None else self._pending.get(JOIN)
            self.running = True
        if request is None:  # this rank has joined: it stands in
            failure = None
            if error is None and join is not None:
                failure = self._execute(kind, join.call.stand_in(kind, active[0][2]), name,
                                        f"{kind} {name!r} (standing in for a joined rank)")
            with self._cond:
                self.running = False
                if failure is not None:
                    del self._pending[JOIN]
                    self.completed += 1
            if failure is not None:
                join.complete(failure)
            return
        if error is None:
            agreed = getattr(request.call, "agreed", None)
            if agreed is not None:
                agreed([None if e is None else e[2] for e in entries])
            error = self._run(request)
        with self._cond:
            del self._pending[name]
            self.running = False
            self.completed += 1
        request.complete(error)

    def _joins_done(self) -> None:
        """Every rank has joined: the join completes, with the highest rank of the last round."""
        last = max(self._joined_at.values())
        result = max(r for r, at in self._joined_at.items() if at == last)
        self._joined_at.clear()
        with self._cond:
            request = self._pending.pop(JOIN)
            self.completed += 1
            self._auto = 0
        request.call.result = result
        request.complete(None)

    def _agree(self, name: str, entries: list) -> Exception | None:
        kinds = [e[1] for e in entries]
        if len(set(kinds)) > 1:
            return ValueError(f"operation {name!r} on {self.label}: the ranks submitted different "
                              "operations under one name ("
                              + ", ".join(f"rank {r}: {k}" for r, k in enumerate(kinds)) + ")")
        rule = entries[0][4]  # one kind, one rule: the signatures' own (else equal signatures)
        if rule is not None and all(e[3] is None for e in entries):
            return rule(f"{kinds[0]} {name!r}", [e[2] for e in entries])
        return verdict(f"{kinds[0]} {name!r}", [(e[2], e[3]) for e in entries])

    def _run(self, request: Request) -> BaseException | None:
        request.started = time.perf_counter()
        try:
            return self._execute(request.kind, request.call, request.name, request.describe())
        finally:
            request.finished = time.perf_counter()

    def _execute(self, kind: str, call: Any, name: str, what: str) -> BaseException | None:
        """Run ``call`` under the guard; the exception it raised, if any (the stream then runs
        nothing more)."""
        if self.failure is not None:
            failed, exc = self.failure
            return EngineError(f"{what} was not run: {failed} failed on this rank "
                               f"({type(exc).__name__}: {exc}); use a new communicator")
        try:
            self.ctx.guard.run(kind, call.run, self.ctx, call=call, what=describe(call, name))
        except Stopped:
            raise
        except Exception as exc:  # noqa: BLE001 - reported by the request's wait()
            self.failure = (what, exc)
            return exc
        return None
