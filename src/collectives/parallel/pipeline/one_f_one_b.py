"""1F1B, PipeDream-flush (Narayanan et al., ICML 2021): one forward, one backward.

Stage ``s`` of ``S`` first runs ``w = min(S - 1 - s, M)`` warm-up forwards (the micro-batches
that must be in flight before the last stage can start its first backward), then alternates
one forward and one backward (the steady state: ``FORWARD w+i``, ``BACKWARD i``) while
forwards remain, and ends with the remaining backwards (the cool-down). Forwards and
backwards each run in micro-batch order, so every send meets its neighbor's receive in the
same order; the receives are posted one compute action ahead
(:func:`.actions.with_messages`). This is ``torch.distributed.pipelining.Schedule1F1B``'s order
and DeepSpeed's ``TrainSchedule``'s.

**Bubble.** The same as GPipe's, ``(S - 1) / (M + S - 1)`` of a step: the warm-up and the
cool-down are GPipe's ramps, and the steady state has no idle time when forward and backward
times are the same on every stage. The parameters are updated once per step (the flush), so
the result is the same as without pipelining.

**Memory.** A micro-batch is held from its forward to its backward: stage ``s`` holds at most
``w + 1 = S - s`` of them (``min(S - s, M)``), at most ``S``, whatever ``M``, where GPipe
holds ``M``.
"""

from __future__ import annotations

from .actions import BACKWARD, FORWARD, Action, with_messages

__all__ = ["one_f_one_b"]


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[Action]:
    """The action list of ``stage`` (0-based) of ``stages`` under 1F1B."""
    warmup = min(stages - 1 - stage, microbatches)
    order = [(FORWARD, m) for m in range(warmup)]
    for i in range(microbatches - warmup):  # steady state
        order += [(FORWARD, warmup + i), (BACKWARD, i)]
    order += [(BACKWARD, m) for m in range(microbatches - warmup, microbatches)]  # cool-down
    return with_messages(order, stage, stages)
