"""Run one stage's action list: compute, with its messages in flight behind it.

:class:`Pipeline` is the plan (made once, collectively, kept by the caller): the schedule's
action list for this rank's stage, the communicator of the pipeline axis (``comm``, where stage
``s`` is rank ``s``) and the notice channel on the whole mesh (:mod:`.failures`).
:meth:`Pipeline.step` runs the list on a :class:`Stage` (the layers and data of this rank):

- ``RECV_ACT m`` / ``RECV_GRAD m`` post a non-blocking receive
  (:func:`collectives.irecv`) into a buffer the stage hands out (:meth:`Stage.buffer`);
- ``FORWARD m`` / ``BACKWARD m`` wait for that receive (the time counted as waiting), then
  call the stage (:meth:`Stage.forward`, :meth:`Stage.backward`);
- ``SEND_ACT m`` / ``SEND_GRAD m`` start a non-blocking send (:func:`collectives.isend`) of
  what the compute returned; sends in flight are tested at every action and waited for at the
  end of the step.

A message's tag is its micro-batch: activations travel from stage ``s`` to ``s + 1`` and
gradients back, so a pair of stages never has two messages of one tag in one direction within
a step, and MPI's order keeps the steps apart. The messages travel on a duplicate of ``comm``
made by the constructor, so nothing a failed step left in flight can meet a later pipeline's
receives. The step ends at a barrier of the whole mesh
(:meth:`.failures.Failures.barrier`), where every stage's idle tail is counted as waiting.

:class:`StepStats` says what the step cost this rank: the seconds waited for receives and at
the step's end (``idle_s``: the bubble, measured, ``idle_s / step_s``), the seconds computed,
and the most micro-batches held at once. An exception of the stage, or a receive that does not
fit its buffer, is sent as a notice to every other rank and raised (:mod:`.failures`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np
from mpi4py import MPI

from ...options import Options
from ...pt2pt.messages import irecv, isend
from .actions import (BACKWARD, FORWARD, RECV_ACT, RECV_GRAD, SEND_ACT, SEND_GRAD, Action,
                      peak_held)
from .failures import Failures, PipelineError
from .schedules import build

__all__ = ["Stage", "StepStats", "Pipeline"]


class Stage(Protocol):
    """What the executor calls on this rank's stage."""

    def buffer(self, kind: str, microbatch: int) -> np.ndarray:
        """A contiguous array to receive ``kind`` (``RECV_ACT``: the stage's input activation,
        ``RECV_GRAD``: the gradient of its output) of ``microbatch`` into."""

    def forward(self, microbatch: int, x: np.ndarray | None) -> np.ndarray | None:
        """The stage's output on ``microbatch`` (``x``: the received input; None on stage 0,
        which reads its own data); keep what backward needs. The last stage returns None."""

    def backward(self, microbatch: int, dy: np.ndarray | None) -> np.ndarray | None:
        """Add ``microbatch``'s parameter gradient (``dy``: the gradient of the output; None on
        the last stage, which starts from its loss); release it; return the gradient of the
        input (None on stage 0)."""


@dataclass
class StepStats:
    """One step of one stage (seconds)."""

    step_s: float = 0.0
    #: waiting for receives inside the step
    wait_s: float = 0.0
    #: waiting at the step's end (sends, the other stages)
    tail_s: float = 0.0
    compute_s: float = 0.0
    #: the most micro-batches held at once (forwarded, not yet backwarded)
    peak_held: int = 0

    @property
    def idle_s(self) -> float:
        return self.wait_s + self.tail_s

    @property
    def bubble(self) -> float:
        """The measured idle fraction of the step."""
        return self.idle_s / self.step_s if self.step_s > 0 else 0.0


class Pipeline:
    """The plan of one rank's stage (module docstring). Collective to make (the notice
    channel duplicates ``world``) and to :meth:`close`.

    Parameters
    ----------
    schedule
        A name of :data:`.schedules.SCHEDULES`.
    microbatches
        Micro-batches per step, at least the number of stages.
    comm
        The pipeline axis: stage ``s`` is rank ``s`` (``Mesh.comm("pp")``).
    world
        Every rank of every pipeline (``Mesh.comm()``; default ``comm``): where a failure is
        told, and the step's closing barrier.
    options
        ``Options.timeout``: every wait raises TimeoutError after that many seconds.
    """

    def __init__(self, schedule: str, microbatches: int, comm: MPI.Comm,
                 world: MPI.Comm | None = None, options: Options | None = None) -> None:
        self.stages, self.stage = comm.size, comm.rank
        self.microbatches = microbatches
        self.actions: list[Action] = build(schedule, self.stages, microbatches)[self.stage]
        self.schedule = schedule
        #: the messages' own communicator: what a failed step leaves in flight stays on it
        self.comm = comm.Dup()
        self.prev = self.stage - 1 if self.stage > 0 else None
        self.next = self.stage + 1 if self.stage < self.stages - 1 else None
        self.options = options
        self.timeout = None if options is None else options.timeout
        self.peak = peak_held(self.actions)
        self.failures = Failures(comm if world is None else world)

    def step(self, stage: Stage) -> StepStats:
        """Run this stage's actions once (one global batch); collective over the mesh."""
        stats = StepStats(peak_held=self.peak)
        t0 = time.perf_counter()
        pending: dict[tuple[str, int], tuple[Any, np.ndarray]] = {}
        outputs: dict[tuple[str, int], np.ndarray | None] = {}
        sends: list[tuple[Any, np.ndarray]] = []
        action = None
        try:
            for action in self.actions:
                kind, m = action
                if kind in (RECV_ACT, RECV_GRAD):
                    buf = stage.buffer(kind, m)
                    peer = self.prev if kind == RECV_ACT else self.next
                    pending[(kind, m)] = (irecv(buf, peer, tag=m, comm=self.comm,
                                                options=self.options), buf)
                elif kind in (FORWARD, BACKWARD):
                    need = RECV_ACT if kind == FORWARD else RECV_GRAD
                    given = None
                    if (need, m) in pending:
                        req, given = pending.pop((need, m))
                        w0 = time.perf_counter()
                        self.failures.wait(req.test, f"{need} {m} from stage "
                                           f"{self.prev if kind == FORWARD else self.next}",
                                           self.timeout)
                        stats.wait_s += time.perf_counter() - w0
                    c0 = time.perf_counter()
                    out = stage.forward(m, given) if kind == FORWARD else stage.backward(m, given)
                    stats.compute_s += time.perf_counter() - c0
                    outputs[(kind, m)] = out
                else:  # SEND_ACT, SEND_GRAD
                    x = outputs.pop((FORWARD if kind == SEND_ACT else BACKWARD, m))
                    peer = self.next if kind == SEND_ACT else self.prev
                    sends.append((isend(x, peer, tag=m, comm=self.comm, options=self.options), x))
                sends = [s for s in sends if not s[0].test()]  # progress; drop the completed
            action = None
            w0 = time.perf_counter()
            for req, _ in sends:
                self.failures.wait(req.test, "a send to complete", self.timeout)
            self.failures.barrier(self.timeout)
            stats.tail_s = time.perf_counter() - w0
        except PipelineError:
            raise
        except BaseException as exc:
            where = f" in {action}" if action is not None else " at the step's end"
            self.failures.tell(f"stage {self.stage} (rank {self.failures.rank}) raised{where}: "
                               f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}")
            raise
        stats.step_s = time.perf_counter() - t0
        return stats

    def close(self) -> None:
        """Free the pipeline's communicators (collective; kept after a failure, when messages
        may still be on their way to them: :mod:`.failures`)."""
        if not self.failures.failed and self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()
            self.comm = MPI.COMM_NULL
        self.failures.close()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
