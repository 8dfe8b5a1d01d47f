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

Framework arrays (PyTorch tensors, JAX arrays, anything exporting ``__dlpack__``) and objects with
the buffer protocol are no kind of their own: every public entry point turns them into a NumPy
array (CPU memory) or a CuPy array (CUDA memory) viewing the same memory with :func:`as_array`
(zero-copy, through DLPack), and gives results back as the caller's type with :func:`like`
(a tensor in, a tensor out). PyTorch is never imported here: a tensor is recognised by its type's
module, and the ``torch`` module it needs is the one the caller already imported. bfloat16, which
NumPy's DLPack import does not know, travels as 16-bit words and is re-typed as
``ml_dtypes.bfloat16`` (the ``bf16`` extra).
"""

from __future__ import annotations

from functools import lru_cache

import sys

import numpy as np

__all__ = ["KINDS", "kind", "is_numpy", "is_device", "is_cupy", "namespace", "host_copy", "cupy",
           "as_array", "like", "same_memory", "is_bfloat16", "bfloat16", "framework"]

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


# ---------------------------------------------------------------------- framework arrays

def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is bfloat16 (``ml_dtypes.bfloat16``; recognised without importing it)."""
    return dtype.isbuiltin != 1 and dtype.name == "bfloat16"  # a user-defined dtype: 2


@lru_cache(maxsize=None)
def bfloat16() -> np.dtype:
    """NumPy's bfloat16 dtype, from ``ml_dtypes`` (imported on first use).

    Raises
    ------
    TypeError
        ``ml_dtypes`` is not installed (``pip install 'collectives[bf16]'``).
    """
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("bfloat16 arrays need the ml_dtypes package: "
                        "pip install 'collectives[bf16]'") from None
    return np.dtype(ml_dtypes.bfloat16)


def framework(x) -> str | None:
    """The top-level module of a framework array (``"torch"``, ``"jaxlib"`` ...): an object
    exporting ``__dlpack__`` that is neither a NumPy nor a CuPy array; None for anything else."""
    t = type(x)
    if t is np.ndarray or isinstance(x, np.ndarray) or _is_cupy_type(t) or not hasattr(x, "__dlpack__"):
        return None
    return t.__module__.split(".", 1)[0]


def _torch_view(x):
    """A tensor the DLPack importers understand: bfloat16 as int16 words, no autograd."""
    if getattr(x, "requires_grad", False):
        raise TypeError("the tensor requires grad: pass tensor.detach() (the collectives write "
                        "outside autograd), or use collectives.torch")
    if str(x.dtype) == "torch.bfloat16":
        return x.view(sys.modules["torch"].int16), True
    return x, False


def _from_dlpack(x):
    """A NumPy (CPU) or CuPy (CUDA) array viewing the memory of the DLPack exporter ``x``."""
    bf16 = False
    if framework(x) == "torch":
        x, bf16 = _torch_view(x)
    if int(x.__dlpack_device__()[0]) == 2:  # kDLCUDA
        if bf16:
            raise TypeError("bfloat16 CUDA tensors are not supported (CuPy has no bfloat16)")
        a = cupy().from_dlpack(x)
    else:
        try:
            a = np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError) as exc:
            try:  # e.g. a JAX bfloat16 array: DLPack has no NumPy type for it, __array__ has
                a = np.asarray(x)
            except Exception:
                raise TypeError(f"cannot view {type(x).__name__} as an array: {exc}") from None
    return a.view(bfloat16()) if bf16 else a


def as_array(x):
    """``x`` as a NumPy or CuPy array viewing the same memory (zero-copy), for the entry points.

    NumPy and CuPy arrays come back as they are; ``__dlpack__`` exporters (PyTorch tensors on
    the CPU or a CUDA device, JAX CPU arrays) through DLPack; objects with the buffer protocol
    (``bytearray``, ``memoryview``, ``array.array``) through ``np.asarray``. Anything else
    (lists, scalars, Numba device arrays) is returned unchanged, for the caller to accept or
    reject.

    Raises
    ------
    TypeError
        A tensor that requires grad, or an exporter whose memory cannot be viewed.
    """
    t = type(x)
    if t is np.ndarray or isinstance(x, np.ndarray) or _is_cupy_type(t) or kind(x) == "numba":
        return x
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _from_dlpack(x)
    try:
        view = memoryview(x)
    except TypeError:
        return x
    try:
        return np.asarray(view)
    except (TypeError, ValueError):
        return x


def _to_torch(result):
    torch = sys.modules["torch"]
    if is_bfloat16(result.dtype):
        return torch.from_dlpack(result.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(result)


#: how a result array becomes the caller's type, by framework (others get NumPy/CuPy arrays)
_RETURN = {"torch": _to_torch}


def like(x, result):
    """``result`` (a NumPy or CuPy array) as the type of the caller's input ``x``, zero-copy: a
    PyTorch tensor for a tensor, the array itself for NumPy, CuPy and every other input."""
    if type(x) is np.ndarray or result is None:
        return result
    convert = _RETURN.get(framework(x))
    return result if convert is None else convert(result)


def _address(a) -> int:
    return a.data.ptr if _is_cupy_type(type(a)) else a.__array_interface__["data"][0]


def same_memory(a, b) -> bool:
    """Whether arrays ``a`` and ``b`` (NumPy or CuPy) view exactly the same elements in the same
    layout: different objects that count as one buffer (in place)."""
    if a is b:
        return True
    if type(a) is not type(b) or a.shape != b.shape or a.strides != b.strides \
            or a.dtype != b.dtype:
        return False
    if type(a) is np.ndarray and a.size and not _may_share(a, b):  # disjoint extents, the
        return False  # common case, told without the array interface's dict (a few us)
    return _address(a) == _address(b)


_may_share = getattr(np.may_share_memory, "_implementation", np.may_share_memory)
