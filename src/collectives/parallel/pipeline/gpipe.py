"""GPipe (Huang et al., NeurIPS 2019): every forward, then every backward.

Stage ``s`` of ``S`` runs ``FORWARD 0 .. M-1``, then ``BACKWARD 0 .. M-1`` (the order
``torch.distributed.pipelining.ScheduleGPipe`` uses), each forward's activation sent on to
``s + 1`` as soon as it is computed, each backward's input gradient back to ``s - 1``; the
receives are posted one compute action ahead (:func:`.actions.with_messages`).

**Bubble.** With forward time ``f`` and backward time ``b`` per micro-batch and stage, the last
stage starts its first forward after ``(S - 1) f`` and the first stage its first backward
``(S - 1) b`` after the last stage's: each stage idles ``(S - 1)(f + b)`` of a step of
``(M + S - 1)(f + b)``, the fraction ``(S - 1) / (M + S - 1)``; small for ``M >= 4 S``.

**Memory.** Every stage holds the activations of all ``M`` micro-batches between its last
forward and its first backward: the peak is ``M`` micro-batches per stage.
"""

from __future__ import annotations

from .actions import BACKWARD, FORWARD, Action, with_messages

__all__ = ["gpipe"]


def gpipe(stage: int, stages: int, microbatches: int) -> list[Action]:
    """The action list of ``stage`` (0-based) of ``stages`` under GPipe."""
    order = [(FORWARD, m) for m in range(microbatches)] + \
            [(BACKWARD, m) for m in range(microbatches)]
    return with_messages(order, stage, stages)
