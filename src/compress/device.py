"""Array kinds: the one place that tells host arrays from device arrays.

Both packages ask this module what an array is: ``compress`` (codecs encode a device array on its
device) and ``collectives`` (a collective takes NumPy or CuPy buffers). The kinds, by :func:`kind`:

``"numpy"``
    A NumPy array (anything else that is not a device array is ``"host"``: lists, scalars, buffers
    that ``np.asarray`` turns into one).
``"cupy"``
    A CuPy array: device memory with NumPy-style arithmetic (:func:`namespace` gives CuPy).
``"numba"``
    A Numba CUDA device array (``numba.cuda.to_device``), including the simulator's: device memory
    without arithmetic; codecs encode and decode it, collectives do not take it.
``"cuda"``
    Any other ``__cuda_array_interface__`` exporter; codecs wrap it with CuPy.

Nothing here imports CuPy or Numba for a NumPy array: :func:`namespace` checks the exact NumPy
type first, so the per-call cost on the host path is one type comparison.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["KINDS", "kind", "is_numpy", "is_device", "is_cupy", "namespace", "host_copy", "cupy"]

#: Every kind :func:`kind` returns; the last three are device memory.
KINDS = ("numpy", "host", "cupy", "numba", "cuda")
_DEVICE = frozenset(KINDS[2:])


def _is_cupy_type(t: type) -> bool:
    return t.__module__.split(".", 1)[0] == "cupy"


def kind(x) -> str:
    """The kind of ``x``: one of :data:`KINDS`."""
    if isinstance(x, np.ndarray):
        return "numpy"
    if _is_cupy_type(type(x)):
        return "cupy"
    if hasattr(x, "copy_to_host") and hasattr(x, "is_c_contiguous"):
        return "numba"
    if hasattr(x, "__cuda_array_interface__"):
        return "cuda"
    return "host"


def is_numpy(x) -> bool:
    """Whether ``x`` is exactly a NumPy array: the hot path's check (one type comparison)."""
    return type(x) is np.ndarray


def is_device(x) -> bool:
    """Whether ``x`` lives in device memory (CuPy, Numba or another CUDA array)."""
    return type(x) is not np.ndarray and kind(x) in _DEVICE


def is_cupy(x) -> bool:
    """Whether ``x`` is a CuPy array (without importing CuPy)."""
    return _is_cupy_type(type(x))


@lru_cache(maxsize=None)
def cupy():
    """The CuPy module, imported on first use."""
    import cupy as cp

    return cp


def namespace(x):
    """The array module for arithmetic on ``x``: NumPy for host arrays, CuPy for CuPy arrays.

    Raises
    ------
    TypeError
        For device arrays without arithmetic (Numba's, foreign CUDA arrays): use CuPy arrays.
    """
    if type(x) is np.ndarray:  # the host fast path: every collective call takes it
        return np
    k = kind(x)
    if k == "cupy":
        return cupy()
    if k in _DEVICE:
        raise TypeError(f"{type(x).__name__} arrays have no arithmetic: use CuPy arrays on the device")
    return np


def host_copy(a) -> np.ndarray:
    """A NumPy copy of ``a`` (a host array, or a device array of any kind)."""
    k = kind(a)
    if k == "cupy":
        return a.get()
    if k == "numba":
        return a.copy_to_host()
    if k == "cuda":
        return cupy().asarray(a).get()
    return np.array(a, copy=True)
