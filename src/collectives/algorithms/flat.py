"""The flat allreduce algorithms by name: those that treat all ranks alike.

"auto" picks one of them and "hierarchical" runs one across nodes, so this table sits below both,
in a module of its own (``algorithms/__init__.py`` adds "hierarchical" and "auto" to make
:data:`collectives.ALGORITHMS`). Tests replace entries here; every user holds this one dict.
"""

from __future__ import annotations

from typing import Callable

from . import native, rabenseifner, recursive_doubling, ring, tree

__all__ = ["FLAT", "Algorithm"]

#: An allreduce algorithm: ``fn(src, buf, op, ctx, opts)`` over flat contiguous arrays.
Algorithm = Callable[..., None]

#: Algorithms that treat all ranks alike; "hierarchical" runs one of them across nodes.
FLAT: dict[str, Algorithm] = {
    "ring": ring.allreduce,
    "tree": tree.allreduce,
    "recursive_doubling": recursive_doubling.allreduce,
    "rabenseifner": rabenseifner.allreduce,
    "native": native.allreduce,
}
