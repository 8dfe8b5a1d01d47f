"""The host backend: NumPy allocation, the Numba kernels of :mod:`compress._kernels.host`.

That module, and with it Numba, is imported the first time an operation is looked up, so
``import compress`` (and ``import collectives``) does not import Numba.
"""

from __future__ import annotations

import numpy as np

from .._util import as_payload

__all__ = ["HostBackend", "HOST"]


class HostBackend:
    """The host backend: NumPy allocation here, kernels from :mod:`compress._kernels.host`."""

    host = True
    where = "host"

    def __getattr__(self, name: str):
        """The host operation ``name``, imported on first use and then kept as an attribute."""
        if name.startswith("_"):
            raise AttributeError(name)
        from .._kernels import host

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
