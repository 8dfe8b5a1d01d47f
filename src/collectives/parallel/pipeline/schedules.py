"""The catalogue of pipeline schedules: name -> generator of one stage's action list.

``SCHEDULES[name](stage, stages, microbatches)`` returns that stage's list of
:class:`~.actions.Action` (:mod:`.gpipe`, :mod:`.one_f_one_b`, each opening with how it works,
its bubble and its peak memory). :func:`build` checks the arguments, the same on every rank,
and returns every stage's list.
"""

from __future__ import annotations

from typing import Callable

from .actions import Action
from .gpipe import gpipe
from .one_f_one_b import one_f_one_b

__all__ = ["SCHEDULES", "build", "check_sizes"]

#: schedule name -> ``(stage, stages, microbatches) -> list[Action]``
SCHEDULES: dict[str, Callable[[int, int, int], list[Action]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
}


def check_sizes(schedule: str, stages: int, microbatches: int) -> None:
    """Raise ValueError for an unknown schedule, fewer than one stage, or fewer micro-batches
    than stages (the pipeline would never fill: every stage idles at least half the step)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; the schedules are "
                         f"{', '.join(SCHEDULES)}")
    for name, v in (("stages", stages), ("micro-batches", microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"pipeline {name} must be a positive integer, got {v!r}")
    if microbatches < stages:
        raise ValueError(f"{microbatches} micro-batches for {stages} pipeline stages: give at "
                         f"least as many micro-batches as stages (the bubble is "
                         f"(S-1)/(M+S-1); M >= 4 S keeps it small)")


def build(schedule: str, stages: int, microbatches: int) -> list[list[Action]]:
    """Every stage's action list under ``schedule`` (checked: :func:`check_sizes`)."""
    check_sizes(schedule, stages, microbatches)
    return [SCHEDULES[schedule](s, stages, microbatches) for s in range(stages)]
