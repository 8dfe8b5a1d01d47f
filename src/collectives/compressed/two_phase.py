"""Two-phase strategy for 1-bit and sign codecs (DeepSpeed's compressed allreduce).

Tang et al., "1-bit Adam: Communication Efficient Large-Scale Training with Adam's Convergence
Speed", ICML 2021. The vector is cut into ``p`` chunks. Phase 1 (workers), the compressed
reduce-scatter's "alltoall" strategy (:func:`.reduce_scatter.alltoall`): each rank compresses
chunk ``i`` (with its own per-chunk error feedback when the codec is wrapped in one) and an
all-to-all sends it to rank ``i``. Rank ``i`` (the server of chunk ``i``) decodes the ``p``
contributions, aggregates them in rank order, and compresses the aggregate again with *server-side*
error feedback for codecs that need it: ``state.server``, a ``compress.ErrorFeedback`` of its own
kept in the call's :class:`~collectives.compressed.state.CompressionState`, per tensor chunk. Phase
2: an allgather returns every server's chunk, and every rank decodes all chunks.

Cost with a compression ratio of c (payload bytes per input byte): 2 (p-1) alpha + 2 c n (p-1)/p
beta: the ring's volume times c, and both halves stay compressed, unlike the allgather strategy
whose volume grows with p. Every rank decodes the same server payloads: results are identical.
"""

from __future__ import annotations

import numpy as np

from .._runtime.arrays import xp
from .._runtime.context import Context
from .._runtime.ranks import partition
from ..options import Options
from . import reduce_scatter
from ._exchange import allgatherv
from .coding import TensorCoding

__all__ = ["allreduce"]


def _server_encode(coding: TensorCoding, agg: np.ndarray, part: int) -> np.ndarray:
    """Compress the server's aggregate, through the state's server-side error feedback when there
    is one (codecs that need error feedback). Without a ``key`` there is no identity to keep
    residuals by, and the aggregate is compressed as it is, by the codec's ``recompressor()``
    (random-k with unbiased scaling: the aggregate is already scaled, so not scaled again)."""
    server = coding.state.server
    encoder = coding.codec.recompressor() if server is None or coding.key is None else server
    return encoder.encode(agg, key=coding.subkey(part), step=coding.step)


def allreduce(x: np.ndarray, out: np.ndarray, coding: TensorCoding, ctx: Context, opts: Options,
              algorithm: str) -> None:
    comm = ctx.comm
    p, r = comm.size, comm.rank
    bounds = partition(x.size, p)
    # phase 1, a compressed reduce-scatter: chunk i goes, compressed, to its server, rank i,
    # which aggregates the p contributions
    agg = xp(x).empty(bounds[r + 1] - bounds[r], dtype=x.dtype)
    reduce_scatter.alltoall(x, bounds, agg, coding, ctx, opts)
    reply = _server_encode(coding, agg, r)
    # phase 2: every server's compressed chunk to everyone
    for i, payload in enumerate(allgatherv(reply, ctx)):
        out[bounds[i]:bounds[i + 1]] = coding.decode(payload, bounds[i + 1] - bounds[i])
