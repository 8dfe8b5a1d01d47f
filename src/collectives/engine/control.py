"""Status queries between the engines of one communicator: who has submitted what.

Horovod's stall check names the ranks that have not submitted a tensor everybody else waits for.
Here every engine looks for queries on its private control communicator (a second duplicate of
the caller's communicator, so these messages never meet an operation's) with a matched probe
(``MPI_Improbe`` from any source, then ``MPI_Mrecv``), which leaves nothing posted: a receive
from any source kept posted for the engine's whole life, tested from several threads and
cancelled at the end is the pattern of a run of MPICH's any-source bugs (its issues #2882, #6027,
#7203; docs/reliability.md). A rank that waits too long sends a query (a round number) to every other rank; each engine answers, from its thread,
with four counters of its communicator: operations submitted, operations finished, the one
running (-1 if none), and named operations pending (:mod:`.named`), and four words of its flight
recorder saying what the rank did last (:mod:`collectives._runtime.last_call`: the call it is in,
or the last one and how long ago it ended). From those the asker names the ranks that have not
submitted the operation it waits for, what they did last, and those still busy with earlier
ones (:meth:`Control.report`: what a stall warning, a ``TimeoutError`` and the report at exit
say).

Engines answer while idle (every :data:`IDLE_POLL_S`) and between polls inside an operation's
waits. A rank that does not answer within the deadline is named as such: it is inside a long
computation of the engine's own, or inside a blocking call of the MPI library.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .._runtime import last_call

__all__ = ["Control", "Status", "IDLE_POLL_S"]

#: How often an idle engine looks for queries.
IDLE_POLL_S = 0.05

_QUERY, _REPLY = 1, 2
_WORDS = 9  # an answer: the round, the status (4 words), the last call (4 words)

#: (operations submitted, operations finished, sequence number of the one running or -1,
#: named operations pending)
Status = tuple[int, int, int, int]


class Control:
    """The query/answer protocol over one control communicator."""

    def __init__(self, comm: MPI.Intracomm, status: Callable[[], Status]) -> None:
        self.comm = comm
        self.status = status
        #: every other rank's last call (:func:`last_call.encode`'s words) at the last :meth:`ask`
        self.last_calls: dict[int, tuple[int, ...]] = {}
        self._inbox = np.zeros(1, dtype=np.int64)
        self._status = MPI.Status()
        self._open = False                 # answering queries
        self._serving = threading.Lock()   # one thread probes and answers at a time
        self._asking = threading.Lock()    # one query round at a time
        self._round = 0
        self.finalizing = False            # inside MPI_Finalize: no more MPI calls

    def open(self) -> None:
        """Start answering (the control communicator must be ready)."""
        self._open = True

    def close(self) -> None:
        """Stop answering; the queries already arrived are received, unanswered (a rank that
        asks gives up on an answer after its deadline)."""
        if self.finalizing:
            return  # no MPI call now
        with self._serving:
            if self._open:
                self._open = False
                while self._next() is not None:
                    pass

    def serve(self) -> None:
        """Answer every query that has arrived (returns at once if another thread is at it)."""
        if not self._open or self.finalizing or not self._serving.acquire(False):
            return
        try:
            while self._open:
                source = self._next()
                if source is None:
                    return
                answer = np.array([self._inbox[0], *self.status(), *last_call.encode()],
                                  dtype=np.int64)
                self.comm.Send(answer, source, _REPLY)  # 72 bytes: sent eagerly
        finally:
            self._serving.release()

    def _next(self) -> int | None:
        """Receive the next query that has arrived into ``_inbox``; its source, or None."""
        message = self.comm.Improbe(MPI.ANY_SOURCE, _QUERY, self._status)
        if message is None:
            return None
        message.Recv(self._inbox)
        return self._status.Get_source()

    def ask(self, deadline_s: float = 1.0) -> dict[int, Status]:
        """Every other rank's status (those that answered within ``deadline_s``), and ours."""
        rank = self.comm.rank
        others = [r for r in range(self.comm.size) if r != rank]
        with self._asking:
            self._round += 1
            question = np.array([self._round], dtype=np.int64)
            sends = [self.comm.Isend(question, r, _QUERY) for r in others]
            boxes = {r: np.zeros(_WORDS, dtype=np.int64) for r in others}
            waiting = {r: self.comm.Irecv(boxes[r], r, _REPLY) for r in others}
            answers: dict[int, Status] = {rank: self.status()}
            end = time.monotonic() + deadline_s
            while waiting and time.monotonic() < end:
                for r in list(waiting):
                    if not waiting[r].Test():
                        continue
                    if boxes[r][0] == self._round:
                        status = tuple(int(v) for v in boxes[r][1:5])
                        answers[r] = status  # type: ignore[assignment]
                        self.last_calls[r] = tuple(int(v) for v in boxes[r][5:])
                        del waiting[r]
                    else:  # a late answer to an earlier round
                        waiting[r] = self.comm.Irecv(boxes[r], r, _REPLY)
                self.serve()  # the asker may be this rank's engine thread itself
                time.sleep(1e-3)
            for request in waiting.values():
                request.Cancel()
                request.Wait()
            MPI.Request.Waitall(sends)  # small messages: already sent eagerly
        return answers

    def report(self, request: Any, label: str, named: Callable[[Any, list[int]], str]) -> str:
        """Why ``request`` is not done, from every rank's status (:meth:`ask`): which ranks have
        not submitted it, or are still busy with earlier operations.

        ``label`` names the communicator. A named request is the named stream's to explain:
        ``named(request, idle)`` (``NamedStream.report``), ``idle`` being the ranks with no named
        operation pending.
        """
        what = request.describe()
        answers = self.ask()
        rank = self.comm.rank
        missing = [r for r in range(self.comm.size) if r not in answers]
        if request.name is not None:
            idle = sorted(r for r, status in answers.items() if status[3] == 0)
            text = named(request, idle) + self._last(idle)
            return text + (f"; rank(s) {_ranks(missing)} did not answer" if missing else "")
        behind = sorted(r for r, (sub, _, _, _) in answers.items() if sub <= request.seq)
        busy = sorted(r for r, (sub, done, run, _) in answers.items()
                      if sub > request.seq and done <= request.seq and run != request.seq
                      and r != rank)
        parts = []
        if behind:
            parts.append(f"rank(s) {_ranks(behind)} have not submitted it (they submitted "
                         + ", ".join(f"{answers[r][0]}" for r in behind)
                         + f" operation(s) on this communicator; it is number {request.seq + 1})"
                         + self._last(behind))
        if busy:
            parts.append(f"rank(s) {_ranks(busy)} are still busy with earlier operations "
                         f"(running #{', #'.join(str(answers[r][2]) for r in busy)})")
        if missing:
            parts.append(f"rank(s) {_ranks(missing)} did not answer the status query")
        running = self.status()[2]  # this rank's operation under way now
        if running not in (-1, request.seq):
            parts.append(f"this rank is still running operation #{running}")
        if not parts:
            parts.append("every rank has submitted it and is working on it")
        return f"{what} on {label}: " + "; ".join(parts)


    def _last(self, ranks: list[int]) -> str:
        """``; what they did last (flight recorder): rank 2: in allreduce #57`` for the ranks
        of ``ranks`` that answered the last :meth:`ask` (this rank excluded)."""
        known = [r for r in ranks if r in self.last_calls and r != self.comm.rank]
        if not known:
            return ""
        return "; what they did last (flight recorder): " + ", ".join(
            f"rank {r}: {last_call.describe(self.last_calls[r])}" for r in known)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
