"""Tree allreduce: binomial-tree reduce to rank 0, then binomial-tree broadcast, in segments.

Every rank sends its (partial) vector to its parent in a binomial tree rooted at rank 0, which
combines its children's vectors with its own; rank 0 then broadcasts the result down the same
tree (see ``blocks/binomial.py``). Both halves are pipelined in segments of at most
``Options.segment_bytes``, so a parent combines segment k while its children send segment k+1.

Cost (unsegmented): 2 lg p alpha + 2 n lg p beta + n lg p gamma. Pipelining brings the beta term
towards 2 n beta for large messages at (lg p + nseg) alpha, but the root's link carries the whole
vector twice, so ring/Rabenseifner still win at large sizes; the tree wins only in latency-bound,
many-rank settings. Results are identical on every rank: they are computed once, on rank 0.
"""

from __future__ import annotations

import numpy as np

from .._runtime.arrays import copy_into
from .._runtime.context import Context
from ..blocks import binomial
from ..ops import Op
from ..options import Options

__all__ = ["allreduce"]


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    copy_into(src, buf)
    binomial.reduce(buf, op, 0, ctx.comm, opts.segment_bytes, ctx.active)
    binomial.bcast(buf, 0, ctx.comm, opts.segment_bytes, ctx.active)
