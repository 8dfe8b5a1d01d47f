"""Kernel backends: one codec implementation, run on the host or on a device (private).

A codec writes its encode and decode once, against a *backend* ``ops``: allocation (``ops.empty``,
``ops.zeros``, ``ops.copy``, ``ops.astype``, ...) and kernels (``ops.gather``, ``ops.topk_indices``,
``ops.quantize_levels``, ...), with the same names and calling conventions on both:

* :data:`HOST`, for NumPy arrays: allocation with NumPy; the operations of
  :mod:`compress._kernels.host` (Numba ``@njit`` kernels). That module, and with it Numba, is imported
  the first time an operation is looked up, so ``import compress`` (and ``import collectives``) does
  not import Numba.
* a :class:`compress._device.Device`, for CUDA device arrays: allocation with CuPy or Numba; the
  operations of :mod:`compress._kernels.cuda.ops`, bound to the device.

:func:`backend_of` picks the one for an array; :mod:`compress.device` says what kind an array is.
"""

from __future__ import annotations

import numpy as np

from ._util import as_payload, inf_word, uint_view
from .device import is_device

__all__ = ["HostBackend", "HOST", "backend_of", "count_nonfinite"]


class HostBackend:
    """The host backend: NumPy allocation here, kernels from :mod:`compress._kernels.host`."""

    host = True
    where = "host"

    def __getattr__(self, name: str):
        """The host operation ``name``, imported on first use and then kept as an attribute."""
        if name.startswith("_"):
            raise AttributeError(name)
        from ._kernels import host

        if name not in host.__all__:
            raise AttributeError(f"the host backend has no operation {name!r}")
        fn = getattr(host, name)
        setattr(self, name, fn)
        return fn

    # ------------------------------------------------------------------ arrays (no kernels)
    @staticmethod
    def wrap(x) -> np.ndarray:
        return np.asarray(x)

    @staticmethod
    def contiguous(x: np.ndarray) -> np.ndarray:
        """``x`` itself if C-contiguous, else a contiguous copy."""
        return x if x.flags.c_contiguous else x.copy(order="C")

    @staticmethod
    def empty(shape, dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    @staticmethod
    def zeros(shape, dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    @staticmethod
    def fill(a: np.ndarray, value) -> None:
        """``a[...] = value`` (an integer into an unsigned view writes exact bits)."""
        a[...] = value

    @staticmethod
    def copy(a: np.ndarray) -> np.ndarray:
        return a.copy()

    @staticmethod
    def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
        dst[...] = src

    @staticmethod
    def astype(a: np.ndarray, dtype) -> np.ndarray:
        """``a`` converted to ``dtype`` (itself when it already has it)."""
        return a if a.dtype == dtype else a.astype(dtype)

    @staticmethod
    def to_host(a: np.ndarray) -> np.ndarray:
        return a

    @staticmethod
    def from_host(a: np.ndarray) -> np.ndarray:
        return a

    # ------------------------------------------------------------------ payloads
    @staticmethod
    def as_payload(payload) -> np.ndarray:
        """A payload to parse: a contiguous, 8-byte aligned 1-D uint8 array (bytes accepted)."""
        return as_payload(payload)

    @staticmethod
    def header_prefix(buf: np.ndarray, nbytes: int) -> np.ndarray:
        return buf

    @staticmethod
    def usable_out(out, nbytes: int) -> bool:
        """Whether ``out`` can take a payload of ``nbytes`` on the host."""
        return (isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.ndim == 1
                and out.flags.c_contiguous and out.flags.writeable and out.size == nbytes)


#: The host backend (one object: its operations are looked up once per process).
HOST = HostBackend()


def backend_of(x):
    """:data:`HOST` for a host array, a :class:`compress._device.Device` for a device array."""
    if type(x) is np.ndarray or not is_device(x):
        return HOST
    from ._device import Device

    return Device(x)


def count_nonfinite(x) -> int:
    """The number of ``±inf`` and NaN elements of the float array ``x`` (host or device): one read
    of it, by the magnitude-key count of the backend (no temporary array)."""
    u, absmask = uint_view(x)
    return int(backend_of(x).count_at_least(u, absmask, inf_word(x.dtype)))
