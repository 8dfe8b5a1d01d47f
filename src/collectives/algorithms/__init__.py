"""The allreduce catalogue: every algorithm by name, in one table.

Each algorithm is a function ``allreduce(src, buf, op, ctx, opts)`` over flat contiguous arrays:
it reduces ``src`` (which may be ``buf`` itself) across ``ctx.comm`` into ``buf``. The public
dispatcher in ``collectives.api`` has already validated the arguments and returned early for
zero elements and for one process, so algorithms never special-case those.
"""

from __future__ import annotations

from ..blocks import BARRIER as _BLOCK_BARRIERS
from . import auto, hierarchical, shm, shm_barrier
from .flat import FLAT, Algorithm

__all__ = ["ALGORITHMS", "BARRIER", "BARRIER_RESOLVERS", "FLAT", "Algorithm"]

#: Every allreduce algorithm by name (``algorithm=`` of :func:`collectives.allreduce`).
ALGORITHMS: dict[str, Algorithm] = {
    **FLAT,
    "hierarchical": hierarchical.allreduce,
    "shm": shm.allreduce,
    "auto": auto.allreduce,
}

#: Every barrier algorithm by name (``algorithm=`` of :func:`collectives.barrier`): the
#: message-based ones of ``collectives.blocks``, "shm" (one node, no message) and "auto" ("shm"
#: on one node, else "dissemination").
BARRIER = {**_BLOCK_BARRIERS, "shm": shm_barrier.barrier, "auto": auto.barrier}
#: The barrier functions a checked call resolves once for its context, each by its resolver
#: ``(ctx, opts) -> barrier function``: "auto" to what it runs there, "shm" to the context's
#: token and lane. A repeated barrier then runs what its first call resolved.
BARRIER_RESOLVERS = {auto.barrier: auto.barrier_for, shm_barrier.barrier: shm_barrier.resolved}
