"""The allreduce catalogue: every algorithm by name, in one table.

Each algorithm is a function ``allreduce(src, buf, op, ctx, opts)`` over flat contiguous arrays:
it reduces ``src`` (which may be ``buf`` itself) across ``ctx.comm`` into ``buf``. The public
dispatcher in ``collectives.api`` has already validated the arguments and returned early for
zero elements and for one process, so algorithms never special-case those.
"""

from __future__ import annotations

from typing import Callable

from . import auto, hierarchical, native, rabenseifner, recursive_doubling, ring, shm, tree

__all__ = ["ALGORITHMS", "FLAT", "Algorithm"]

Algorithm = Callable[..., None]

#: Algorithms that treat all ranks alike; "hierarchical" runs one of them across nodes.
FLAT: dict[str, Algorithm] = {
    "ring": ring.allreduce,
    "tree": tree.allreduce,
    "recursive_doubling": recursive_doubling.allreduce,
    "rabenseifner": rabenseifner.allreduce,
    "native": native.allreduce,
}

# The same table object, not a copy: replacing an entry here (tests do) changes it there too.
auto.FLAT = hierarchical.FLAT = FLAT

#: Every allreduce algorithm by name (``algorithm=`` of :func:`collectives.allreduce`).
ALGORITHMS: dict[str, Algorithm] = {
    **FLAT,
    "hierarchical": hierarchical.allreduce,
    "shm": shm.allreduce,
    "auto": auto.allreduce,
}
