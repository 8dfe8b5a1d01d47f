"""The round driver run by the Python interpreter, for calls made while its kernel compiles
(private).

A process's first shm call in a dtype needs :func:`~.rounds.run_rounds`'s machine code, which
Numba compiles in seconds (docs/benchmarks/first-call.md). Meanwhile this rank can take
part in the call with :func:`run_rounds` from here instead: the *same* Python functions as the
kernels (each kernel's ``py_func``, the very code object), with the names they look up replaced,
so that they run in the interpreter:

- the kernels they call by their own interpreted twins (built the same way, recursively);
- the memory primitives of ``memory`` and ``copies`` (typed pointers, acquire loads, release
  stores, streaming stores, the fence, ``process_vm_readv``) by :mod:`ctypes` and NumPy;
- ``arithmetic.fold`` by :func:`fold`, which makes the same operations in the same order with
  NumPy's ufuncs (one element at a time in the interpreter would take seconds per call).

So the protocol is the kernel's own, counter by counter: no rank needs to know which driver
another one runs, ranks on either meet in the same window, and a failure is what it is with the
kernels (docs/shm-protocol.md). The results are the same bits: each element is ``((x_0 op x_1)
op x_2) ...`` in rank order on either driver, with NumPy's semantics, which ``fold`` follows
(float16 computed in float32 and rounded after every operation, NaN propagating from the first
operand, ``min(0.0, -0.0) = -0.0``; ``tests/test_shm_kernels.py`` checks ``fold`` against chained
NumPy bit for bit).

Memory ordering: in the interpreter every load and store of a counter is a C call of its own,
so no compiler moves data accesses across it; the processor must not either, which x86-64
guarantees for plain loads (acquire) and stores (release), and which :func:`supported` therefore
requires. Elsewhere the caller waits for the kernel.
"""

from __future__ import annotations

import ctypes
import platform
import types
from typing import Any, Callable

import numpy as np

from ..layout import T_SPIN

__all__ = ["supported", "run_rounds", "fold"]

_UFUNCS = (np.add, np.multiply, np.minimum, np.maximum)  # layout.OPCODES' order


def supported() -> bool:
    """Whether this processor orders plain loads and stores as the protocol's acquire loads and
    release stores require (x86-64: total store order), and the interpreted driver could be
    built from this Numba's kernels (:func:`driver`)."""
    return platform.machine().lower() in ("x86_64", "amd64") and driver() is not None


def _dtype(token: np.ndarray) -> np.dtype:
    """The element dtype of a format token (``memory.FLOAT16``'s record: float16)."""
    return np.dtype(np.float16) if token.dtype.names else token.dtype


def pointer(addr: int, token: np.ndarray) -> tuple[int, np.dtype]:
    return int(addr), (np.dtype(np.uint16) if token.dtype.names else token.dtype)


def carray(ptr: tuple[int, np.dtype], count: int) -> np.ndarray:
    addr, dtype = ptr
    count = int(count)
    if count <= 0:
        return np.empty(0, dtype)
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(addr), dtype)


def load_acquire(addr: int) -> int:
    return ctypes.c_int64.from_address(int(addr)).value


def store_release(addr: int, value: int) -> None:
    ctypes.c_int64.from_address(int(addr)).value = int(value)


def copy(dst: int, src: int, nbytes: int) -> None:
    if nbytes > 0:
        ctypes.memmove(int(dst), int(src), int(nbytes))


def fence() -> None:
    """Nothing: the copies here are plain stores (glibc's ``memmove`` fences its own
    non-temporal ones)."""


_READV: dict[int, Callable] = {}


def _readv(fn: int, pid: int, local: int, remote: int) -> int:
    fn = int(fn)
    call = _READV.get(fn)
    if call is None:
        call = _READV[fn] = ctypes.CFUNCTYPE(
            ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
            ctypes.c_ulong, ctypes.c_ulong, use_errno=True)(fn)
    return call(int(pid), int(local), 1, int(remote), 1, 0)


def _errno(fn: int) -> int:
    return ctypes.get_errno()


def fold(op: int, token: np.ndarray, srcs: np.ndarray, nsrc: int, dsts: np.ndarray, ndst: int,
         count: int, scratch: int) -> None:
    """``arithmetic.fold`` with NumPy: ``dsts[k] = srcs[0] op srcs[1] op ...`` in that order,
    the whole segment at once (into a temporary, so a destination may be any source)."""
    if ndst == 0 or count == 0:
        return
    dtype = _dtype(token)
    first = carray((int(srcs[0]), dtype), count)
    if nsrc == 1:
        acc = first
    else:
        ufunc = _UFUNCS[op]
        acc = ufunc(first, carray((int(srcs[1]), dtype), count))
        for q in range(2, nsrc):
            ufunc(acc, carray((int(srcs[q]), dtype), count), out=acc)
    for k in range(ndst):
        if int(dsts[k]) != acc.ctypes.data:
            carray((int(dsts[k]), dtype), count)[:] = acc


#: What the kernels' names stand for in the interpreter.
REPLACED: dict[str, Any] = {
    "pointer": pointer, "carray": carray, "load_acquire": load_acquire,
    "store_release": store_release, "store_streaming": store_release, "fence": fence,
    "copy": copy, "copy_streaming": copy, "_readv": _readv, "_errno": _errno, "fold": fold,
}


def interpret(kernel: Any, done: dict | None = None) -> Callable:
    """``kernel``'s Python function with its global names bound as :data:`REPLACED` says and
    every other kernel it calls interpreted too."""
    from numba.core.registry import CPUDispatcher

    done = {} if done is None else done
    twin = done.get(kernel)
    if twin is None:
        py = kernel.py_func
        names = dict(py.__globals__)
        twin = done[kernel] = types.FunctionType(py.__code__, names, py.__name__,
                                                 py.__defaults__, py.__closure__)
        for name in py.__code__.co_names:
            if name in REPLACED:
                names[name] = REPLACED[name]
            elif isinstance(names.get(name), CPUDispatcher):
                names[name] = interpret(names[name], done)
    return twin


#: Polls without progress before the interpreted driver returns ``WAITING`` (the team's
#: ``T_SPIN`` counts the kernel's polls of a few nanoseconds; one here is a few Python calls).
SPIN = 4

_DRIVER: Callable | None = None
_FAILED = False


def driver() -> Callable | None:
    """The interpreted ``rounds.run_rounds``, built on first use; None where it cannot be built
    (a Numba whose dispatchers differ: the caller then waits for the kernel)."""
    global _DRIVER, _FAILED
    if _DRIVER is None and not _FAILED:
        try:
            from .rounds import run_rounds as kernel

            _DRIVER = interpret(kernel)
        except Exception:  # noqa: BLE001 - whatever fails, the caller waits for the kernel
            _FAILED = True
    return _DRIVER


def run_rounds(tab: np.ndarray, *args: Any) -> int:
    """``rounds.run_rounds``, interpreted (same arguments, same results), polling :data:`SPIN`
    times before it returns ``WAITING``. Only where :func:`supported`."""
    spin, tab[T_SPIN] = tab[T_SPIN], SPIN
    try:
        return driver()(tab, *args)
    finally:
        tab[T_SPIN] = spin
