"""alltoall's "auto": Bruck for short equal blocks, pairwise exchange otherwise.

Bruck (``bruck.py``) pays ceil(log2 p) latencies and sends about half of a rank's data in each
round; pairwise exchange (``pairwise.py``) pays p - 1 latencies and sends every byte once. With
alpha-beta costs Bruck wins while a block is short next to alpha/beta; MPICH switches at 256
bytes per block (``MPIR_CVAR_ALLTOALL_SHORT_MSG_SIZE``), and so does this: blocks of at most
:data:`BRUCK_BLOCK_BYTES` and more than two ranks take Bruck, everything else (long blocks, the
v form with ``counts=``, which Bruck declines) pairwise. The decision reads only values every
rank has alike (block size, p, whether counts were given), so every rank picks the same.

Not yet done: the threshold is MPICH's constant, not a fit of this machine; alltoall's formulas
joining the cost model and the tuning file (``selection/``) is future work.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .._runtime.context import Context
from ..options import Options
from .handwritten import bruck_alltoall, pairwise_alltoall

__all__ = ["BRUCK_BLOCK_BYTES", "alltoall", "choose"]

#: the longest block (bytes) that "auto" sends with Bruck
BRUCK_BLOCK_BYTES = 256


def choose(block_bytes: int | None, p: int) -> object:
    """The alltoall function "auto" runs for blocks of ``block_bytes`` (None: the v form)."""
    if block_bytes is not None and block_bytes <= BRUCK_BLOCK_BYTES and p > 2:
        return bruck_alltoall
    return pairwise_alltoall


def alltoall(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
             recvoffsets: Sequence[int] | None, ctx: Context, opts: Options) -> None:
    block = None if recvoffsets is not None else int(sendoffsets[1] - sendoffsets[0]) * src.itemsize
    choose(block, ctx.comm.size)(src, dst, sendoffsets, recvoffsets, ctx, opts)
