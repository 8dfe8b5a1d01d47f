"""Sparsity warm-up: how dense a sparsifier's payload is at each training step.

Deep Gradient Compression (Lin, Han, Mao, Wang & Dally, ICLR 2018, section 3.3) does not start at
its target sparsity: early gradients change fast, and a tiny density there delays convergence.
It raises the sparsity exponentially over the first epochs, 75 %, 93.75 %, 98.4375 %, 99.6 %, and
then trains at 99.9 %. :class:`SparsityWarmup` is that schedule by step: at step ``t``, stage
``s = t // steps_per_stage``; while ``s < stages`` the density is ``start * factor**s`` (never
below the codec's own), afterwards the codec's own density. The defaults are the paper's
(``start=0.25``, ``factor=0.25``, four stages); ``steps_per_stage`` is the steps of one epoch.

The schedule is a pure function of the step, so every rank computes the same density (a payload's
size is never negotiated) and a run resumed from a checkpoint continues it without saving state.
:class:`compress.DGCMemory` applies it (``warmup=``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SparsityWarmup"]


@dataclass(frozen=True)
class SparsityWarmup:
    """DGC's exponential sparsity warm-up (see the module docstring).

    Parameters
    ----------
    steps_per_stage : int
        Steps at each density (the paper: one epoch), >= 1.
    stages : int
        How many densities before the codec's own, >= 0 (0: no warm-up).
    start : float
        The first stage's density, in (0, 1].
    factor : float
        What each stage multiplies the density by, in (0, 1].
    """

    steps_per_stage: int
    stages: int = 4
    start: float = 0.25
    factor: float = 0.25

    def __post_init__(self) -> None:
        if not isinstance(self.steps_per_stage, int) or self.steps_per_stage < 1:
            raise ValueError(f"steps_per_stage must be an integer >= 1, got "
                             f"{self.steps_per_stage!r}")
        if not isinstance(self.stages, int) or self.stages < 0:
            raise ValueError(f"stages must be an integer >= 0, got {self.stages!r}")
        for name in ("start", "factor"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")

    def density(self, step: int, final: float) -> float:
        """The density at ``step`` (>= 0) of a sparsifier whose own density is ``final``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        stage = step // self.steps_per_stage
        if stage >= self.stages:
            return final
        return max(final, self.start * self.factor ** stage)
