"""Auto: pick an algorithm from the message size and the number of ranks.

The rule (measured on a 2-core machine with the MPICH wheel; see docs/algorithms.md):

- ``count < pof2`` or at most ``SMALL_BYTES``: "recursive_doubling" (lg p messages: latency is
  all there is to win, and it matched ``MPI_Allreduce`` there);
- otherwise "rabenseifner" (2 lg p messages and the bandwidth-optimal volume; fastest or within
  noise of the fastest from 64 KiB to 4 MiB at p = 2 and 4). "ring" pays p-1 latency terms per
  half, which oversubscribed ranks on few cores make expensive.

The alpha-beta model and per-machine tuning files refine this later (benchmark issue).
"""

from __future__ import annotations

import numpy as np

from .._context import Context
from ..ops import Op
from ..options import Options
from ._fold import pof2_of

__all__ = ["choose", "allreduce", "SMALL_BYTES"]

SMALL_BYTES = 8 << 10


def choose(nbytes: int, count: int, p: int) -> str:
    """The algorithm "auto" runs for ``count`` elements (``nbytes`` bytes) on ``p`` ranks."""
    if count < pof2_of(p) or nbytes <= SMALL_BYTES:
        return "recursive_doubling"
    return "rabenseifner"


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    from . import FLAT  # the table imports this module

    FLAT[choose(buf.nbytes, buf.size, ctx.comm.size)](src, buf, op, ctx, opts)
