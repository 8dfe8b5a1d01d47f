"""Reusable scratch buffers, so that a collective allocates nothing per call beyond its result.

Each algorithm asks for its scratch by its own name; a buffer grows to the largest request seen and
is then reused. Names keep nested algorithms (hierarchical calling ring) from sharing one buffer.
"""

from __future__ import annotations

import numpy as np

__all__ = ["scratch"]

_POOL: dict[str, np.ndarray] = {}


def scratch(name: str, count: int, dtype: np.dtype) -> np.ndarray:
    """A 1-D array of ``count`` elements of ``dtype`` (uninitialised), reused across calls."""
    nbytes = count * dtype.itemsize
    buf = _POOL.get(name)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 64), dtype=np.uint8)
        _POOL[name] = buf
    return buf[:nbytes].view(dtype)
