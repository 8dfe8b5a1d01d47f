"""The allreduce catalogue: every algorithm by name, in one table.

Each algorithm is a function ``allreduce(src, buf, op, ctx, opts)`` over flat contiguous arrays:
it reduces ``src`` (which may be ``buf`` itself) across ``ctx.comm`` into ``buf``. The public
dispatcher in ``collectives.api`` has already validated the arguments and returned early for
zero elements and for one process, so algorithms never special-case those.
"""

from __future__ import annotations

from . import auto, hierarchical, shm
from .flat import FLAT, Algorithm

__all__ = ["ALGORITHMS", "FLAT", "Algorithm"]

#: Every allreduce algorithm by name (``algorithm=`` of :func:`collectives.allreduce`).
ALGORITHMS: dict[str, Algorithm] = {
    **FLAT,
    "hierarchical": hierarchical.allreduce,
    "shm": shm.allreduce,
    "auto": auto.allreduce,
}
