"""Ring allreduce: ring reduce-scatter followed by ring allgather (Patarasuk & Yuan 2009).

The vector is cut into ``p`` blocks. In p-1 steps of the reduce-scatter every rank passes a
partial block to its right neighbour and folds the one arriving from its left neighbour into its
own, so that rank ``r`` ends with block ``r`` fully reduced; p-1 steps of the allgather then pass
the finished blocks around the ring (see ``blocks/ring.py`` for the step-by-step schedule). Blocks
are cut into segments of at most ``Options.segment_bytes``.

Cost: 2 (p-1) alpha + 2 n (p-1)/p beta + n (p-1)/p gamma: the bandwidth lower bound, paid for with
p-1 latency terms in each half. Wins for large messages; loses to recursive doubling for small ones.
Results are bitwise identical on every rank because each block is reduced on exactly one rank and
then copied.
"""

from __future__ import annotations

import numpy as np

from .._runtime.context import Context
from .._runtime.arrays import copy_into
from .._runtime.ranks import partition
from ..blocks import ring
from ..ops import Op
from ..options import Options

__all__ = ["allreduce"]


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    copy_into(src, buf)
    offsets = partition(buf.size, ctx.comm.size)
    ring.reduce_scatter(buf, offsets, op, ctx.comm, opts.segment_bytes, ctx.active)
    ring.allgather(buf, offsets, ctx.comm, ctx.active)
