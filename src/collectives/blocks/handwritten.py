"""The hand-written blocks behind the names "ring" and "binomial" of the block tables.

Thin adapters from the table signatures (``blocks/__init__.py``) to the schedules in ``ring.py`` and
``binomial.py``; ``native.py`` falls back on them once native is retired (``_runtime/guard.py``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .._runtime.arrays import copy_into
from .._runtime.context import Context
from .._runtime.workspace import scratch
from ..ops import Op
from ..options import Options
from . import binomial, ring

__all__ = ["ring_reduce_scatter", "ring_allgather", "binomial_bcast", "binomial_reduce"]


def ring_reduce_scatter(src: np.ndarray, out: np.ndarray, offsets: Sequence[int], op: Op,
                         ctx: Context, opts: Options) -> None:
    work = scratch("blocks.reduce_scatter", src.size, src)
    copy_into(src, work)  # the ring overwrites its input with partial results
    ring.reduce_scatter(work, offsets, op, ctx.comm, opts.segment_bytes, ctx.active)
    r = ctx.comm.rank
    copy_into(work[offsets[r]:offsets[r + 1]], out)


def ring_allgather(src: np.ndarray, out: np.ndarray, offsets: Sequence[int], ctx: Context,
                    opts: Options) -> None:
    r = ctx.comm.rank
    copy_into(src, out[offsets[r]:offsets[r + 1]])
    ring.allgather(out, offsets, ctx.comm, ctx.active)


def binomial_bcast(buf: np.ndarray, root: int, ctx: Context, opts: Options) -> None:
    binomial.bcast(buf, root, ctx.comm, opts.segment_bytes, ctx.active)


def binomial_reduce(src: np.ndarray, out: np.ndarray | None, op: Op, root: int, ctx: Context,
                     opts: Options) -> None:
    acc = out if out is not None else scratch("blocks.reduce", src.size, src)
    copy_into(src, acc)
    binomial.reduce(acc, op, root, ctx.comm, opts.segment_bytes, ctx.active)
