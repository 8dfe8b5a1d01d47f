"""Auto: pick an algorithm from the message size and the number of ranks.

The rule (measured on a 2-core machine with the MPICH wheel; see docs/algorithms.md):

- ``count < pof2`` or at most ``SMALL_BYTES`` (64 KiB): "native". There latency is all there is,
  and every hand-written step pays a few microseconds of Python that MPI's C path does not: the
  best of ours (recursive doubling) measured 1.04-1.45x ``MPI_Allreduce``'s time at 8 B - 8 KiB.
- above: "rabenseifner" (2 lg p messages and the bandwidth-optimal volume): 0.43-1.04x native's
  time from 1 MiB to 4 MiB at p = 2, 4, 8, the best or within noise of the best of ours. "ring"
  pays p-1 latency terms per half, which oversubscribed ranks on few cores make expensive.

The alpha-beta model and per-machine tuning files refine this later (benchmark issue).
"""

from __future__ import annotations

import numpy as np

from .._context import Context
from ..ops import Op
from ..options import Options
from ._fold import pof2_of

__all__ = ["choose", "allreduce", "SMALL_BYTES"]

SMALL_BYTES = 64 << 10


def choose(nbytes: int, count: int, p: int) -> str:
    """The algorithm "auto" runs for ``count`` elements (``nbytes`` bytes) on ``p`` ranks."""
    if count < pof2_of(p) or nbytes <= SMALL_BYTES:
        return "native"
    return "rabenseifner"


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    from . import FLAT  # the table imports this module

    FLAT[choose(buf.nbytes, buf.size, ctx.comm.size)](src, buf, op, ctx, opts)
