"""Two-phase strategy for 1-bit and sign codecs (DeepSpeed's compressed allreduce).

Tang et al., "1-bit Adam: Communication Efficient Large-Scale Training with Adam's Convergence
Speed", ICML 2021. The vector is cut into ``p`` chunks. Phase 1 (workers): each rank compresses
chunk ``i`` (with its own per-chunk error feedback when the codec is wrapped in one) and an
all-to-all sends it to rank ``i``. Rank ``i`` (the server of chunk ``i``) decodes the ``p``
contributions, aggregates them in rank order, and compresses the aggregate again with *server-side*
error feedback, kept here per tensor key, for codecs that need error feedback. Phase 2: an
allgather returns every server's chunk, and every rank decodes all chunks.

Cost with a compression ratio of c (payload bytes per input byte): 2 (p-1) alpha + 2 c n (p-1)/p
beta: the ring's volume times c, and both halves stay compressed, unlike the allgather strategy
whose volume grows with p. Every rank decodes the same server payloads: results are identical.
"""

from __future__ import annotations

import numpy as np

from .._arrays import xp
from .._context import Context, context
from ..options import Options
from .._p2p import partition
from ._exchange import allgatherv, alltoallv
from ._plan import Plan

__all__ = ["allreduce", "server_residuals"]


def server_residuals(ctx_or_comm) -> dict:
    """The server-side error-feedback residuals of a communicator, by (codec name, chunk key).

    The live dictionary: a checkpoint saves its arrays and a resumed run puts them back, so the
    two-phase strategy continues bit for bit. Each rank holds the residuals of the chunks it
    serves.
    """
    ctx = ctx_or_comm if isinstance(ctx_or_comm, Context) else context(ctx_or_comm)
    return ctx.cached("two_phase.server_residuals", lambda _: {})


def _server_encode(plan: Plan, agg: np.ndarray, part: int, ctx: Context) -> np.ndarray:
    """Compress the server's aggregate, with server-side error feedback for codecs needing it.

    The residuals live in the communicator's context, by codec, tensor key and chunk; without a ``key``
    there is no identity to keep them by, and the aggregate is compressed as it is.
    """
    base = plan.base
    subkey = plan.subkey(part)
    if not base.needs_error_feedback or plan.key is None:
        return base.encode(agg, key=subkey, step=plan.step)
    residuals = server_residuals(ctx)
    slot = (base.name, subkey)
    error = residuals.get(slot)
    if error is not None and error.shape != agg.shape:
        raise ValueError(f"key {plan.key!r}: the tensor changed size from {error.size * ctx.comm.size}"
                         f"-ish to {agg.size * ctx.comm.size}-ish elements; use one key per tensor")
    compensated = agg if error is None else agg + error
    payload = base.encode(compensated, key=subkey, step=plan.step)
    residuals[slot] = compensated - base.decode(payload, count=agg.size).reshape(-1)
    return payload


def allreduce(x: np.ndarray, out: np.ndarray, plan: Plan, ctx: Context, opts: Options,
              algorithm: str) -> None:
    comm = ctx.comm
    p, r = comm.size, comm.rank
    bounds = partition(x.size, p)
    # phase 1: chunk i goes, compressed, to its server, rank i
    mine = alltoallv([plan.encode(x[bounds[i]:bounds[i + 1]], part=i) for i in range(p)], comm)
    decoded = [plan.decode(payload, bounds[r + 1] - bounds[r]) for payload in mine]
    agg = xp(x).empty(bounds[r + 1] - bounds[r], dtype=x.dtype)
    plan.aggregate_into(decoded, agg)
    reply = _server_encode(plan, agg, r, ctx)
    # phase 2: every server's compressed chunk to everyone
    for i, payload in enumerate(allgatherv(reply, comm)):
        out[bounds[i]:bounds[i + 1]] = plan.decode(payload, bounds[i + 1] - bounds[i])
