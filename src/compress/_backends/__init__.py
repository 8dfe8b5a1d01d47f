"""Kernel backends: one codec implementation, run on the host or on a device (private).

A codec writes its encode and decode once, against a *backend* ``ops``: allocation (``ops.empty``,
``ops.zeros``, ``ops.copy``, ``ops.astype``, ...) and kernels (``ops.gather``, ``ops.topk_indices``,
``ops.quantize_levels``, ...), with the same names and calling conventions on both:

* :data:`HOST`, for NumPy arrays: allocation with NumPy; the operations of
  :mod:`compress._kernels.host` (Numba ``@njit`` kernels). That module, and with it Numba, is
  imported the first time an operation is looked up, so ``import compress`` (and ``import
  collectives``) does not import Numba.
* a :class:`compress._backends.cuda.Device`, for CUDA device arrays: allocation with CuPy or
  Numba; the operations of :mod:`compress._kernels.cuda.ops`, bound to the device.

:func:`backend_of` picks the one for an array; :mod:`compress.arrays` says what kind an array is.
"""

from __future__ import annotations

import numpy as np

from .._util import inf_word, uint_view
from ..arrays import is_device
from .host import HOST, HostBackend

__all__ = ["HostBackend", "HOST", "backend_of", "count_nonfinite"]


def backend_of(x):
    """:data:`HOST` for a host array, a :class:`~compress._backends.cuda.Device` for a device
    array."""
    if type(x) is np.ndarray or not is_device(x):
        return HOST
    from .cuda import Device

    return Device(x)


def count_nonfinite(x) -> int:
    """The number of ``±inf`` and NaN elements of the float array ``x`` (host or device): one read
    of it, by the magnitude-key count of the backend (no temporary array)."""
    u, absmask = uint_view(x)
    return int(backend_of(x).count_at_least(u, absmask, inf_word(x.dtype)))
