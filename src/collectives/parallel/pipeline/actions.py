"""The actions a pipeline schedule is made of, and checks of a schedule's properties.

A schedule is data: for each stage ``s`` of ``S``, a list of :class:`Action` that the stage runs
in order (:mod:`.executor`), as ``torch.distributed.pipelining`` represents its schedules
(``_Action(stage, computation_type, microbatch)``). Six kinds:

- ``FORWARD m``: the stage's layers on micro-batch ``m``'s input (the data on stage 0, else the
  activation ``RECV_ACT m`` brought); the stage keeps what backward needs (one micro-batch
  held);
- ``BACKWARD m``: the gradient of micro-batch ``m`` through the stage's layers (from the loss
  on the last stage, else from the gradient ``RECV_GRAD m`` brought), added to the stage's
  parameter gradient; the micro-batch is released;
- ``SEND_ACT m`` / ``RECV_ACT m``: the output of ``FORWARD m`` to stage ``s + 1`` / its input
  from stage ``s - 1``;
- ``SEND_GRAD m`` / ``RECV_GRAD m``: the input gradient of ``BACKWARD m`` to stage ``s - 1``
  / its output gradient from stage ``s + 1``.

A send starts when the stage reaches it (non-blocking) and completes in the background; a
receive is *posted* where it stands and waited for by the compute action that needs it, so a
schedule posts its receives one compute action ahead (:func:`with_messages`) and the message
travels while the stage computes.

:func:`check` verifies what every schedule must satisfy (forward before backward per
micro-batch, every compute once, sends matched by receives in the same order, no deadlock);
:func:`peak_held` counts the micro-batches a stage holds at once; :func:`simulate` runs the
schedule with given compute times and reports each stage's idle fraction, the bubble.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

__all__ = ["Action", "FORWARD", "BACKWARD", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD",
           "KINDS", "with_messages", "check", "peak_held", "simulate", "ideal_bubble"]

FORWARD, BACKWARD = "FORWARD", "BACKWARD"
SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD"
KINDS = (FORWARD, BACKWARD, SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD)
#: which receive brings a compute action's input, which send carries its output
_NEEDS = {FORWARD: RECV_ACT, BACKWARD: RECV_GRAD}
_GIVES = {FORWARD: SEND_ACT, BACKWARD: SEND_GRAD}


class Action(NamedTuple):
    """One step of a stage's schedule: ``kind`` (one of :data:`KINDS`) of micro-batch
    ``microbatch``."""

    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind} {self.microbatch}"


def with_messages(order: Sequence[tuple[str, int]], stage: int, stages: int) -> list[Action]:
    """A stage's action list from its compute order (``(FORWARD, m)`` and ``(BACKWARD, m)``
    pairs): each compute action's receive posted before the compute action ahead of it (so
    it arrives while that one runs), its send right after it. Stage 0 receives no activation
    and sends no gradient, the last stage sends no activation and receives no gradient."""
    def receives(kind: str) -> bool:
        return (stage > 0) if kind == FORWARD else (stage < stages - 1)

    def sends(kind: str) -> bool:
        return (stage < stages - 1) if kind == FORWARD else (stage > 0)

    out: list[Action] = []
    order = [(k, int(m)) for k, m in order]
    if order and receives(order[0][0]):
        out.append(Action(_NEEDS[order[0][0]], order[0][1]))
    for i, (kind, m) in enumerate(order):
        if i + 1 < len(order) and receives(order[i + 1][0]):  # posted one compute ahead
            out.append(Action(_NEEDS[order[i + 1][0]], order[i + 1][1]))
        out.append(Action(kind, m))
        if sends(kind):
            out.append(Action(_GIVES[kind], m))
    return out


def peak_held(actions: Sequence[Action]) -> int:
    """The most micro-batches a stage holds at once: forwarded, not yet backwarded."""
    held = peak = 0
    for a in actions:
        if a.kind == FORWARD:
            held += 1
            peak = max(peak, held)
        elif a.kind == BACKWARD:
            held -= 1
    return peak


def ideal_bubble(stages: int, microbatches: int) -> float:
    """GPipe's bubble fraction (Huang et al. 2019), 1F1B's too: ``(S - 1) / (M + S - 1)``."""
    return (stages - 1) / (microbatches + stages - 1)


def check(schedule: Sequence[Sequence[Action]], microbatches: int) -> None:
    """Raise ValueError unless ``schedule`` (one action list per stage) is runnable: each stage
    forwards and backwards every micro-batch once, forward before backward; it receives
    exactly what it needs before the compute that needs it; every send is matched by the
    neighbor's receive of the same kind in the same order; and running it cannot deadlock
    (:func:`simulate` finishes)."""
    stages = len(schedule)
    everything = set(range(microbatches))
    for s, actions in enumerate(schedule):
        for a in actions:
            if a.kind not in KINDS or not 0 <= a.microbatch < microbatches:
                raise ValueError(f"stage {s}: bad action {a}")
        fwd = [a.microbatch for a in actions if a.kind == FORWARD]
        bwd = [a.microbatch for a in actions if a.kind == BACKWARD]
        if sorted(fwd) != sorted(everything) or sorted(bwd) != sorted(everything):
            raise ValueError(f"stage {s}: forwards {fwd} and backwards {bwd} must each cover "
                             f"micro-batches 0-{microbatches - 1} once")
        seen: set[tuple[str, int]] = set()
        for a in actions:
            if a.kind == BACKWARD and (FORWARD, a.microbatch) not in seen:
                raise ValueError(f"stage {s}: {a} before its forward")
            need = _NEEDS.get(a.kind)
            first_or_last = (s == 0) if a.kind == FORWARD else (s == stages - 1)
            if need and not first_or_last and (need, a.microbatch) not in seen:
                raise ValueError(f"stage {s}: {a} before its {need}")
            if a.kind in (SEND_ACT, SEND_GRAD) and \
                    ({SEND_ACT: FORWARD, SEND_GRAD: BACKWARD}[a.kind], a.microbatch) not in seen:
                raise ValueError(f"stage {s}: {a} before the compute that makes it")
            if (a.kind, a.microbatch) in seen:
                raise ValueError(f"stage {s}: {a} twice")
            seen.add((a.kind, a.microbatch))
    for s in range(stages - 1):
        for send, recv, a, b in ((SEND_ACT, RECV_ACT, s, s + 1), (SEND_GRAD, RECV_GRAD, s + 1, s)):
            sent = [x.microbatch for x in schedule[a] if x.kind == send]
            got = [x.microbatch for x in schedule[b] if x.kind == recv]
            if sent != got or sorted(sent) != sorted(everything):
                raise ValueError(f"stage {a} sends {send} {sent}, stage {b} receives "
                                 f"{recv} {got}: they must match, in order, every micro-batch")
    for s in (0, stages - 1):
        wrong = {0: (RECV_ACT, SEND_GRAD), stages - 1: (SEND_ACT, RECV_GRAD)}[s]
        if any(a.kind in wrong for a in schedule[s]):
            raise ValueError(f"stage {s} has no neighbor for {' or '.join(wrong)}")
    simulate(schedule)


def simulate(schedule: Sequence[Sequence[Action]], forward_s: float = 1.0,
             backward_s: float = 2.0) -> dict:
    """Run ``schedule`` on paper: every forward takes ``forward_s``, every backward
    ``backward_s``, messages take no time; a compute action starts when its stage is free and
    its input has come. Returns ``{"makespan", "busy": [per stage], "bubble": [per stage idle
    fraction]}``; raises ValueError if the stages deadlock (a receive whose send is never
    reached)."""
    stages = len(schedule)
    pos = [0] * stages
    clock = [0.0] * stages
    busy = [0.0] * stages
    # arrival time of each message, by (receiving stage, kind of receive, micro-batch)
    arrived: dict[tuple[int, str, int], float] = {}
    done = {FORWARD: {}, BACKWARD: {}}  # (stage, m) -> end time of the compute
    while any(p < len(a) for p, a in zip(pos, schedule)):
        moved = False
        for s in range(stages):
            while pos[s] < len(schedule[s]):
                a = schedule[s][pos[s]]
                if a.kind in (FORWARD, BACKWARD):
                    first_or_last = (s == 0) if a.kind == FORWARD else (s == stages - 1)
                    start = clock[s]
                    if not first_or_last:
                        t = arrived.get((s, _NEEDS[a.kind], a.microbatch))
                        if t is None:
                            break  # not yet sent
                        start = max(start, t)
                    span = forward_s if a.kind == FORWARD else backward_s
                    clock[s] = start + span
                    busy[s] += span
                    done[a.kind][(s, a.microbatch)] = clock[s]
                elif a.kind == SEND_ACT:
                    arrived[(s + 1, RECV_ACT, a.microbatch)] = done[FORWARD][(s, a.microbatch)]
                elif a.kind == SEND_GRAD:
                    arrived[(s - 1, RECV_GRAD, a.microbatch)] = done[BACKWARD][(s, a.microbatch)]
                pos[s] += 1  # a receive is only posted here; its wait is the compute's
                moved = True
        if not moved:
            stuck = [f"stage {s} at {schedule[s][pos[s]]}" for s in range(stages)
                     if pos[s] < len(schedule[s])]
            raise ValueError(f"the schedule deadlocks: {'; '.join(stuck)}")
    makespan = max(clock) if clock else 0.0
    return {"makespan": makespan, "busy": busy,
            "bubble": [1 - b / makespan if makespan else 0.0 for b in busy]}
