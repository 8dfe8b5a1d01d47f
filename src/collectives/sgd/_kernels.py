"""Numba kernel of the driver's optimizer (private): the momentum SGD update in one pass.

NumPy spells PyTorch's update ``g += wd * p; v *= mu; v += g; p -= lr * v`` as six passes over
the parameters and two full-size temporaries (timed in docs/benchmarks/cluster.md, "Time to
accuracy"); this kernel reads ``p``, ``g`` and ``v`` once and writes ``p`` and ``v`` once,
element by element, with the same float operations in the same order (no fused multiply-add:
``fastmath`` off), so its bits are NumPy's.
"""

from __future__ import annotations

from compress import compile_notice
from numba import njit

__all__ = ["NJIT", "momentum_step"]

NJIT = dict(cache=True, nogil=True, fastmath=False)

compile_notice.install()  # a line on rank 0 while a first compile stalls a call


@njit(**NJIT)
def momentum_step(params, grad, velocity, lr, momentum, weight_decay):  # pragma: no cover
    """``g = grad + weight_decay * params`` (skipped when it is 0), ``velocity = momentum *
    velocity + g``, ``params -= lr * velocity``, in place; the scalars in the arrays' dtype."""
    decay = weight_decay != 0
    for i in range(params.size):
        g = grad[i]
        if decay:
            g = g + weight_decay * params[i]
        v = momentum * velocity[i] + g
        velocity[i] = v
        params[i] = params[i] - lr * v
