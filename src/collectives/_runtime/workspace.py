"""Reusable scratch buffers, so that a collective allocates nothing per call beyond its result.

Each algorithm asks for its scratch by its own name; a buffer grows to the largest request seen and
is then reused. Names keep nested algorithms (hierarchical calling ring) from sharing one buffer.
Scratch lives where the data does: ``like`` (the buffer being reduced) decides NumPy or CuPy.
Each thread has its own pool: a non-blocking operation on the progress engine's thread never
shares scratch with a blocking one on the caller's. :func:`held_bytes` sums every live thread's
buffers (memory reports).
"""

from __future__ import annotations

import threading

import numpy as np

from .arrays import xp

__all__ = ["scratch", "forget", "held_bytes"]

_LOCAL = threading.local()
#: every thread's pool, with its thread (:func:`held_bytes` reads them; a finished thread's drops)
_POOLS: list[tuple[threading.Thread, dict]] = []


def scratch(name: str, count: int, like: np.ndarray) -> np.ndarray:
    """A 1-D array of ``count`` elements of ``like``'s dtype, in ``like``'s array library
    (uninitialised), reused across calls."""
    try:
        pool = _LOCAL.pool
    except AttributeError:
        pool = _LOCAL.pool = {}
        _POOLS.append((threading.current_thread(), pool))
    dtype = like.dtype
    key = (name, count, dtype, type(like))  # a repeated request: the view made last time
    view = pool.get(key)
    if view is not None:
        return view
    nbytes = count * dtype.itemsize
    module = xp(like)
    buf = pool.get((name, module))
    if buf is None or buf.nbytes < nbytes:
        _drop_views(pool, name)  # views of the smaller buffer
        buf = module.empty(max(nbytes, 64), dtype=np.uint8)
        pool[(name, module)] = buf
    if len(pool) >= MAX_ENTRIES:  # requests of ever new sizes: start the views again
        _drop_views(pool, None)
    view = pool[key] = buf[:nbytes].view(dtype)
    return view


def held_bytes() -> int:
    """Bytes of the scratch buffers every live thread's pool holds now (memory reports)."""
    _POOLS[:] = [(t, pool) for t, pool in _POOLS if t.is_alive()]
    return sum(int(v.nbytes) for _, pool in list(_POOLS) for k, v in list(pool.items())
               if len(k) == 2)


#: A thread's pool keeps at most about this many buffers and views.
MAX_ENTRIES = 256


def _drop_views(pool: dict, name: str | None) -> None:
    """Forget the views of ``name``'s buffer (None: of every buffer)."""
    for key in [k for k in pool if len(k) == 4 and (name is None or k[0] == name)]:
        del pool[key]


def forget(name: str, buf: np.ndarray) -> None:
    """Hand out a new buffer at the next :func:`scratch` of ``name`` (and ``buf``'s library):
    ``buf``, which that one returned, still belongs to an operation MPI has not finished."""
    pool = getattr(_LOCAL, "pool", {})
    pool.pop((name, xp(buf)), None)
    _drop_views(pool, name)
