"""Numba kernels behind the codecs (private).

Every kernel module in this package takes only NumPy arrays and scalars, never codec objects, and is
compiled with the single option set :data:`NJIT` so that caching and floating-point semantics are the
same everywhere. ``fastmath`` stays off: several kernels rely on exact IEEE behaviour (round-to-even
tricks, NaN ordering through integer views).
"""

NJIT = dict(cache=True, nogil=True, fastmath=False)

__all__ = ["NJIT"]
