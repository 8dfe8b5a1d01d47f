"""CuPy (GPU) buffers: detection, stream synchronisation and the two ways to MPI.

Every collective accepts CuPy arrays and returns CuPy arrays; reductions run on the device (NumPy
ufuncs dispatch to CuPy through ``__array_ufunc__``). What differs is how device memory reaches MPI:

- **CUDA-aware MPI** (:func:`cuda_aware`): device buffers go to MPI directly. Before any MPI call
  that reads or writes device memory the current CUDA stream is synchronised, since MPI knows
  nothing of CUDA streams (mpi4py's documentation; without it results are random).
- **Otherwise** each message is staged through reusable pinned host buffers: device -> pinned
  host -> MPI, and MPI -> pinned host -> device.

:func:`cuda_aware` asks the MPI library (``MPIX_Query_cuda_support``, which MPICH and Open MPI both
export) unless ``COLLECTIVES_CUDA_AWARE`` is set to 1 or 0. The path taken is visible:
:data:`LAST_PATH` names it after every device message ("cuda-aware" or "staged"), and the
``collectives`` logger says which at DEBUG level once per process.

Nothing here is imported for NumPy arrays; CuPy is imported on first use.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from functools import lru_cache, wraps
from typing import Any, Callable

import numpy as np
from compress.arrays import cupy, is_cupy, is_device, is_numpy

__all__ = ["cuda_aware", "synchronize", "to_mpi", "from_mpi", "landed", "staged", "LAST_PATH"]

LOG = logging.getLogger("collectives")
ENV = "COLLECTIVES_CUDA_AWARE"

#: The path the last device message took: "cuda-aware" or "staged" (None before any).
LAST_PATH: str | None = None

_PINNED: dict[tuple[str, int], Any] = {}


@lru_cache(maxsize=None)
def _library_says() -> bool:
    """``MPIX_Query_cuda_support()`` of the loaded MPI library, False where it has none."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libmpi" in line}
    except OSError:  # not Linux: no way to ask; assume not CUDA-aware
        return False
    for path in sorted(paths):
        try:
            return bool(ctypes.CDLL(path).MPIX_Query_cuda_support())
        except (OSError, AttributeError):
            continue
    return False


def cuda_aware() -> bool:
    """Whether device buffers may go to MPI directly (``COLLECTIVES_CUDA_AWARE`` overrides)."""
    raw = os.environ.get(ENV, "")
    if raw:
        return raw.lower() in ("1", "true", "yes", "on")
    return _library_says()


def synchronize() -> None:
    """Wait for the current CUDA stream, so MPI sees finished device memory."""
    cupy().cuda.get_current_stream().synchronize()


def _direct() -> bool:
    """Before MPI touches device memory: synchronise the stream, then say (and note in
    :data:`LAST_PATH`) whether device buffers go to MPI directly or are staged."""
    global LAST_PATH
    synchronize()
    path = "cuda-aware" if cuda_aware() else "staged"
    if LAST_PATH != path:
        LOG.debug("collectives: device buffers %s", "go to MPI directly (CUDA-aware MPI)"
                  if path == "cuda-aware" else "are staged through pinned host memory")
    LAST_PATH = path
    return path == "cuda-aware"


def _pinned(slot: str, nbytes: int) -> np.ndarray:
    """A reusable page-locked host buffer of at least ``nbytes`` for ``slot`` (per thread: the
    progress engine's thread stages its own messages)."""
    slot = (slot, threading.get_ident())
    buf = _PINNED.get(slot)
    if buf is None or buf.nbytes < nbytes:
        cp = cupy()
        mem = cp.cuda.alloc_pinned_memory(max(nbytes, 64))
        buf = np.frombuffer(mem, dtype=np.uint8, count=max(nbytes, 64))
        _PINNED[slot] = buf
    return buf[:nbytes]


def to_mpi(a: Any, slot: str) -> Any:
    """What to hand MPI to *send* device array ``a``: ``a`` itself, or a pinned host copy."""
    if _direct():
        return a
    host = _pinned(slot, a.nbytes)
    a.reshape(-1).view(np.uint8).get(out=host)
    return host


def from_mpi(a: Any, slot: str) -> Any:
    """What MPI should *receive* into for device array ``a`` (finish with :func:`landed`)."""
    if _direct():
        return a
    return _pinned(slot, a.nbytes)


def landed(a: Any, received: Any) -> None:
    """After a receive into ``from_mpi(a, ...)``: move staged bytes to the device."""
    if received is not a:
        a.reshape(-1).view(np.uint8).set(received)


def staged(*positions: int) -> Callable:
    """Decorator for calls into the MPI library's own collectives (the "native" paths).

    When an argument at ``positions`` is a device array: with CUDA-aware MPI the call gets it as
    it is (after a stream synchronisation); otherwise every such array is copied into a pinned
    host buffer (one per distinct array, so in-place calls stay in place), the call runs on those,
    and the buffers are copied back to the device. NumPy calls pass straight through.
    """

    def wrap(fn: Callable) -> Callable:
        def other(args: tuple, kwargs: dict) -> Any:
            for i in positions:
                a = args[i]
                if a is not None and type(a) is not np.ndarray and not is_numpy(a):
                    break
            else:
                return fn(*args, **kwargs)
            device = [i for i in positions if args[i] is not None and is_cupy(args[i])]
            if not device:
                return fn(*args, **kwargs)
            if _direct():
                return fn(*args, **kwargs)
            hosts: dict[int, np.ndarray] = {}
            new = list(args)
            for i in device:
                a = args[i]
                if id(a) not in hosts:
                    host = _pinned(f"native{i}", a.nbytes).view(a.dtype)
                    a.reshape(-1).get(out=host)
                    hosts[id(a)] = host
                new[i] = hosts[id(a)]
            result = fn(*new, **kwargs)
            for i in device:
                args[i].reshape(-1).set(hosts[id(args[i])])
            return result

        if len(positions) > 2:
            @wraps(fn)
            def call(*args, **kwargs):
                return other(args, kwargs)
            return call
        first, last = positions[0], positions[-1]
        ndarray = np.ndarray

        @wraps(fn)
        def call(*args, **kwargs):  # the NumPy fast path: two type tests
            if kwargs or type(args[first]) is not ndarray or type(args[last]) is not ndarray:
                return other(args, kwargs)
            return fn(*args)

        return call

    return wrap
