"""Momentum SGD with learning-rate warm-up, cosine decay and the linear scaling rule.

Linear scaling rule (Goyal et al. 2017, *Accurate, Large Minibatch SGD*): the peak learning rate
grows with the global batch, ``peak = base_lr * global_batch / 256``, where ``global_batch`` is
the per-rank batch times the number of ranks. Training starts at ``peak / warmup_steps`` and rises
linearly to ``peak`` over ``warmup_steps`` steps (Goyal's gradual warm-up), then decays to zero
along a half cosine (Loshchilov & Hutter 2017) by the last step.

The update is PyTorch's SGD with momentum ``mu`` and weight decay ``wd``::

    g = g + wd * p;   v = mu * v + g;   p = p - lr * v

in float32, on the flat parameter buffer, so every rank that applies the same averaged gradient
ends with the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Schedule", "SGD"]


@dataclass(frozen=True)
class Schedule:
    """Learning rate per step: linear warm-up to ``peak``, then cosine decay to zero."""

    base_lr: float
    global_batch: int
    warmup_steps: int
    total_steps: int

    def __post_init__(self):
        if self.base_lr <= 0 or self.global_batch < 1 or self.total_steps < 1 or self.warmup_steps < 0:
            raise ValueError(f"bad schedule {self}")

    @property
    def peak(self) -> float:
        return self.base_lr * self.global_batch / 256

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak * (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        return 0.5 * self.peak * (1 + math.cos(math.pi * min(1.0, (step - self.warmup_steps) / span)))


@dataclass
class SGD:
    """Momentum SGD over one flat parameter array; ``velocity`` is the momentum buffer."""

    params: np.ndarray
    momentum: float = 0.9
    weight_decay: float = 0.0
    velocity: np.ndarray = field(init=False)

    def __post_init__(self):
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        self.velocity = np.zeros_like(self.params)

    def step(self, grad: np.ndarray, lr: float) -> None:
        """Apply one update with the (averaged) gradient ``grad`` (one pass: the Numba kernel
        of ``_kernels``, NumPy's bits)."""
        self.step_range(0, self.params.size, grad, lr)

    def step_range(self, lo: int, hi: int, grad: np.ndarray, lr: float) -> None:
        """The update of elements ``[lo, hi)`` only, with their averaged gradient ``grad``: the
        update is element by element, so updating a shard slice by slice as each slice's
        gradient lands (sharded stages 2-3) gives the bits of :meth:`step` on the whole."""
        from ._kernels import momentum_step

        t = self.params.dtype.type
        momentum_step(self.params[lo:hi], grad.reshape(-1), self.velocity[lo:hi], t(lr),
                      t(self.momentum), t(self.weight_decay))

    def step_numpy(self, grad: np.ndarray, lr: float) -> None:
        """The same update in NumPy (six passes, two temporaries): the kernel's reference;
        ``grad`` is clobbered."""
        t = self.params.dtype.type
        if self.weight_decay:
            grad += t(self.weight_decay) * self.params
        self.velocity *= t(self.momentum)
        self.velocity += grad
        self.params -= t(lr) * self.velocity
