"""Reusable scratch buffers, so that a collective allocates nothing per call beyond its result.

Each algorithm asks for its scratch by its own name; a buffer grows to the largest request seen and
is then reused. Names keep nested algorithms (hierarchical calling ring) from sharing one buffer.
Scratch lives where the data does: ``like`` (the buffer being reduced) decides NumPy or CuPy.
"""

from __future__ import annotations

import numpy as np

from ._arrays import xp

__all__ = ["scratch"]

_POOL: dict[tuple[str, object], np.ndarray] = {}


def scratch(name: str, count: int, like: np.ndarray) -> np.ndarray:
    """A 1-D array of ``count`` elements of ``like``'s dtype, in ``like``'s array library
    (uninitialised), reused across calls."""
    dtype = like.dtype
    nbytes = count * dtype.itemsize
    module = xp(like)
    buf = _POOL.get((name, module))
    if buf is None or buf.nbytes < nbytes:
        buf = module.empty(max(nbytes, 64), dtype=np.uint8)
        _POOL[(name, module)] = buf
    return buf[:nbytes].view(dtype)
