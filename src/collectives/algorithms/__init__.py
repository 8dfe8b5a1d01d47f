"""The allreduce catalogue: every algorithm by name, in one table.

Each algorithm is a function ``allreduce(src, buf, op, ctx, opts)`` over flat contiguous arrays:
it reduces ``src`` (which may be ``buf`` itself) across ``ctx.comm`` into ``buf``. The public
dispatcher in ``collectives.api`` has already validated the arguments and returned early for
zero elements and for one process, so algorithms never special-case those.
"""

from __future__ import annotations

from ..blocks import ALLTOALL as _BLOCK_ALLTOALLS
from ..blocks import BARRIER as _BLOCK_BARRIERS
from ..blocks import EQUAL_BLOCKS_ONLY as _BLOCK_EQUAL_ONLY
from . import auto, hierarchical, shm, shm_alltoall, shm_barrier
from .flat import FLAT, Algorithm

__all__ = ["ALGORITHMS", "ALLTOALL", "ALLTOALL_RESOLVERS", "ALLTOALLV_SETUP", "BARRIER",
           "BARRIER_RESOLVERS", "EQUAL_BLOCKS_ONLY", "FLAT", "Algorithm"]

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

#: Every alltoall algorithm by name (``algorithm=`` of :func:`collectives.alltoall`): the
#: message-based ones of ``collectives.blocks``, "shm" (one node: each rank copies its blocks
#: straight from the others' memory, equal blocks or the v form's) and "auto" ("shm" on one
#: node, else the cost model's pick for equal blocks and pairwise for the v form).
ALLTOALL = {**_BLOCK_ALLTOALLS, "shm": shm_alltoall.alltoall, "auto": auto.alltoall}
#: The alltoall entries that need equal blocks (no ``counts=``): Bruck's.
EQUAL_BLOCKS_ONLY = _BLOCK_EQUAL_ONLY
#: The alltoall functions a remembered call resolves once for its arrays and context, each by
#: its resolver ``(src, dst, ctx, opts, v) -> alltoall function`` (``v``: of the v form).
ALLTOALL_RESOLVERS = {auto.alltoall: auto.alltoall_resolved,
                      shm_alltoall.alltoall: shm_alltoall.resolved}
#: What the v form of an alltoall function does collectively before its first message
#: ``(ctx, opts) -> exchange of the receive counts or None``: "auto" (on one node) and "shm"
#: make the shm team (after the receive counts' exchange a rank may raise alone) and exchange
#: the counts through it ``(sent, got)``; None: a Bruck alltoall of the counts.
ALLTOALLV_SETUP = {auto.alltoall: auto.alltoallv_setup, shm_alltoall.alltoall: shm_alltoall.setup}
