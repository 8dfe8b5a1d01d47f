"""Device (GPU) arrays for the codecs: allocating, copying, launching (private).

A codec that meets a device array encodes and decodes it on that device with the Numba CUDA kernels of
:mod:`compress._kernels.cuda`, and its payload is a device ``uint8`` array with the same bytes a host
encode would give. Two array libraries are understood:

* **CuPy** (and anything else exposing ``__cuda_array_interface__`` that CuPy can wrap): allocation
  goes through CuPy's memory pool and kernels launch on CuPy's current stream, so they are ordered
  with the caller's CuPy work.
* **Numba device arrays** (``numba.cuda.to_device``), including the simulator's
  (``NUMBA_ENABLE_CUDASIM=1``), which is how the device path is tested without a GPU. Type casts of
  Numba arrays go through the host; CuPy is the library for real work.

:class:`Device` holds what differs between the two, and is the codecs' *device backend*: it has the
host backend's allocation methods (:class:`compress._backends.HostBackend`) and, through attribute
lookup, every operation of :mod:`compress._kernels.cuda.ops` bound to itself, so a codec calls
``ops.gather(src, idx, out)`` on either. What kind an array is, :mod:`compress.arrays` says. Nothing
here imports CUDA until a device array is seen.
"""

from __future__ import annotations

from functools import cached_property, partial

import numpy as np

from ..arrays import host_copy, is_device, kind, namespace

__all__ = ["Device", "is_device", "namespace", "host_copy"]


class Device:
    """Allocation, transfers and kernel launches for arrays of the same library as ``like``."""

    host = False
    where = "device"

    def __init__(self, like):
        self.kind = kind(like)
        self.cupy = self.kind != "numba"
        if self.cupy:
            import cupy

            self.xp = cupy
        from numba import cuda

        self._cuda = cuda

    # ------------------------------------------------------------------ arrays
    def __getattr__(self, name):
        """The device operation ``name`` of :mod:`compress._kernels.cuda.ops`, bound to this device
        (looked up once per device object)."""
        if name.startswith("_"):
            raise AttributeError(name)
        from .._kernels.cuda import ops

        if name not in ops.__all__:
            raise AttributeError(f"the device backend has no operation {name!r}")
        bound = partial(getattr(ops, name), dev=self)
        setattr(self, name, bound)
        return bound

    def wrap(self, x):
        """``x`` as an array of this library (CuPy wraps foreign ``__cuda_array_interface__`` arrays)."""
        return self.xp.asarray(x) if self.cupy and kind(x) != "cupy" else x

    def empty(self, shape, dtype):
        if self.cupy:
            return self.xp.empty(shape, dtype=dtype)
        return self._cuda.device_array(shape, dtype=dtype)

    def zeros(self, shape, dtype):
        if self.cupy:
            return self.xp.zeros(shape, dtype=dtype)
        out = self.empty(shape, dtype)
        self.fill(out, 0)
        return out

    def fill(self, a, value) -> None:
        """``a[...] = value`` for a contiguous device array (an integer into an unsigned view
        writes exact bits)."""
        flat = a.reshape(-1)
        if flat.size:
            from .._kernels.cuda import blocks, elementwise

            self.launch(elementwise.fill, blocks(flat.size), flat, flat.dtype.type(value))

    def to_host(self, a) -> np.ndarray:
        return a.get() if self.cupy else a.copy_to_host()

    def to_device(self, host: np.ndarray):
        host = np.ascontiguousarray(host)
        return self.xp.asarray(host) if self.cupy else self._cuda.to_device(host)

    from_host = to_device

    def as_payload(self, payload):
        """A payload to parse: a contiguous, 8-byte aligned 1-D uint8 device array."""
        if payload.dtype != np.uint8 or payload.ndim != 1:
            raise TypeError(f"payload must be a 1-D uint8 array, got {payload.ndim}-D {payload.dtype}")
        buf = self.contiguous(self.wrap(payload))
        return self.copy(buf) if self.address(buf) % 8 else buf

    def header_prefix(self, buf, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of ``buf`` (or all of it) on the host: all a header read needs."""
        return self.to_host(buf[: min(buf.size, nbytes)])

    def usable_out(self, out, nbytes: int) -> bool:
        """Whether ``out`` can take a payload of ``nbytes`` on this device."""
        return (is_device(out) and out.dtype == np.uint8 and out.ndim == 1 and out.size == nbytes
                and Device(out).cupy == self.cupy and self.is_contiguous(out))

    def write(self, dst, host: np.ndarray) -> None:
        """Copy the host array ``host`` into the device array ``dst`` (same size)."""
        if self.cupy:
            dst.set(np.ascontiguousarray(host))
        else:
            dst.copy_to_device(np.ascontiguousarray(host))

    def copy(self, src):
        """A new device array equal to ``src``."""
        if self.cupy:
            return src.copy()
        out = self.empty(src.shape, src.dtype)
        self.copy_into(out, src)
        return out

    def copy_into(self, dst, src) -> None:
        """``dst[...] = src`` for contiguous device arrays of equal size and dtype."""
        if self.cupy:
            self.xp.copyto(dst, src)
        elif src.size:
            from .._kernels.cuda import blocks, elementwise

            self.launch(elementwise.gather_all, blocks(src.size), src.reshape(-1), dst.reshape(-1))

    def astype(self, a, dtype):
        """``a`` converted to ``dtype`` (itself when it already has it); NumPy's rounding."""
        dtype = np.dtype(dtype)
        if a.dtype == dtype:
            return a
        if self.cupy:
            return a.astype(dtype)
        return self.to_device(self.to_host(a).astype(dtype))

    def is_contiguous(self, x) -> bool:
        return x.flags.c_contiguous if self.cupy else x.is_c_contiguous()

    def contiguous(self, x):
        """``x`` itself if C-contiguous, else a contiguous copy."""
        if self.is_contiguous(x):
            return x
        return self.xp.ascontiguousarray(x) if self.cupy else self.to_device(self.to_host(x))

    @staticmethod
    def address(a) -> int:
        iface = getattr(a, "__cuda_array_interface__", None)
        if iface is not None:
            return int(iface["data"][0])
        return 0  # the simulator's arrays: host memory, any alignment works

    # ------------------------------------------------------------------ kernels
    @cached_property
    def stream(self):
        """The stream kernels launch on: CuPy's current stream, else the default stream."""
        if self.cupy:
            ptr = self.xp.cuda.get_current_stream().ptr
            return self._cuda.external_stream(ptr) if ptr else 0
        return 0

    def launch(self, kernel, nblocks: int, *args) -> None:
        from .._kernels.cuda import launch

        launch(kernel, nblocks, self.stream, *args)
