"""Array handling for every public entry point: the one place that knows array types.

Collectives see a flat, contiguous 1-D view of the caller's array (``flat``) and never look at
shapes, strides or array libraries themselves. Two array libraries are accepted: NumPy, and CuPy
for GPU buffers (``_runtime/device.py`` says how those reach MPI); :func:`xp` gives the module of an
array, so allocation and copies here work for both and the algorithms stay library-agnostic.
What kind an array is, :mod:`compress.arrays` decides, for both packages.

Framework arrays come in here too: :func:`check_input` and :func:`check_out` view PyTorch tensors
(CPU or CUDA), other ``__dlpack__`` exporters and buffer-protocol objects as NumPy or CuPy arrays,
zero-copy, and :func:`returned` gives the caller a result of the input's type. An ``out`` that
views exactly the input's memory through another object counts as in place. bfloat16 arrays
(``ml_dtypes.bfloat16``) are accepted everywhere; :func:`flat` views them as 16-bit words, which
is what the algorithms move and the ops' word forms reduce (``ops.py``).
"""

from __future__ import annotations

import numpy as np
from compress.arrays import as_array, framework, is_bfloat16, is_cupy, like, namespace, same_memory

__all__ = ["SUPPORTED_DTYPES", "check_input", "check_out", "writeable", "flat", "new_like",
           "copy_into", "xp", "returned", "unowned"]

#: Every dtype a collective accepts, by NumPy name.
SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(name)
    for name in (
        "float16", "float32", "float64",
        "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64",
    )
)
_SUPPORTED = frozenset(SUPPORTED_DTYPES)
# np.may_share_memory without its __array_function__ dispatch (a third of the per-call cost of
# the check on small arrays); the dispatching function where NumPy does not expose it
_may_share_memory = getattr(np.may_share_memory, "_implementation", np.may_share_memory)
_NAMES = ", ".join(str(d) for d in SUPPORTED_DTYPES) + ", bfloat16 (ml_dtypes / torch)"


#: The array module of an array: NumPy, or CuPy for a CuPy array (compress.arrays.namespace).
xp = namespace


def check_input(x: object, what: str = "x") -> np.ndarray:
    """``x`` as a NumPy or CuPy array (zero-copy) if it is a contiguous array of a supported
    dtype, else raise.

    An ndarray subclass (``np.memmap``, ``np.matrix``) is returned as a plain ndarray view of
    its memory (results of ``out=None`` are plain ndarrays); a masked array raises TypeError.

    Raises
    ------
    TypeError
        ``x`` is not an array (NumPy, CuPy, a ``__dlpack__`` exporter such as a PyTorch tensor,
        or a buffer), is a masked array, or its dtype is neither in :data:`SUPPORTED_DTYPES`
        nor bfloat16.
    ValueError
        ``x`` is neither C- nor Fortran-contiguous.
    """
    if type(x) is np.ndarray:
        a = x
    elif isinstance(x, np.ndarray):
        a = _plain(x, what)
    else:
        a = as_array(x)
    if not isinstance(a, np.ndarray) and not is_cupy(a):
        raise TypeError(f"{what} must be a numpy.ndarray, a cupy.ndarray, a tensor exporting "
                        f"__dlpack__ or a buffer, got {type(x).__name__}")
    if a.dtype not in _SUPPORTED and not is_bfloat16(a.dtype):
        raise TypeError(f"{what} has unsupported dtype {a.dtype}; supported dtypes: {_NAMES}")
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        hint = f"{what}.contiguous()" if framework(x) == "torch" else f"np.ascontiguousarray({what})"
        raise ValueError(f"{what} must be contiguous (C or Fortran order); pass {hint}")
    return a


def _plain(x: np.ndarray, what: str) -> np.ndarray:
    """An ndarray subclass (``np.memmap``, ``np.matrix``, a user's own) as a plain ndarray view of
    the same memory; a masked array is refused, since its mask would be ignored."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{what} is a masked array (numpy.ma): a collective would ignore its "
                        f"mask; pass {what}.filled(value), or {what}.data to ignore it")
    return x.view(np.ndarray)


def check_out(out: object, x: np.ndarray, shape: tuple[int, ...] | None = None,
              what: str = "out") -> np.ndarray:
    """Check a caller-supplied result array against the input ``x``.

    ``shape`` is the expected result shape (``x.shape`` when None). ``out`` must have that shape,
    ``x``'s dtype, be writeable, contiguous in the same memory order as ``x`` (so element ``i`` of
    the flat views corresponds), and either be ``x`` itself (in place) or not overlap it. An
    ``out`` viewing exactly ``x``'s memory (another object) is in place: ``x`` is returned.
    """
    expected = x.shape if shape is None else shape
    if out is x and shape is None:  # in place: x is checked already
        if not writeable(out):
            raise ValueError(f"{what} is read-only")
        return out
    out = check_input(out, what)
    if shape is None and out is not x and same_memory(out, x):
        out = x
    if type(out) is not type(x) and xp(out) is not xp(x):
        raise ValueError(f"{what} must live where the input does (both NumPy or both CuPy)")
    if out.shape != expected:
        raise ValueError(f"{what} has shape {out.shape}, expected {expected}")
    if out.dtype != x.dtype:
        raise ValueError(f"{what} has dtype {out.dtype}, expected {x.dtype} (the input's dtype)")
    if not writeable(out):
        raise ValueError(f"{what} is read-only")
    if out is not x:
        if shape is None and out.ndim > 1 and out.flags.c_contiguous != x.flags.c_contiguous:
            raise ValueError(f"{what} must have the same memory order (C or Fortran) as the input")
        overlaps = _may_share_memory if type(x) is np.ndarray else xp(x).may_share_memory
        if overlaps(out, x):
            raise ValueError(f"{what} overlaps the input without being the input; "
                             f"pass out=x to reduce in place")
    return out


def own_block(out: object, whole: np.ndarray, lo: int, hi: int) -> np.ndarray | None:
    """``out`` checked, if it views exactly elements ``lo:hi`` of the flat input ``whole``: an
    in-place reduce-scatter's result, landing in the rank's own block of its input (NCCL's
    in-place layout, ``recvbuff == sendbuff + rank * recvcount``); else None (``out`` is then
    checked as any other, and may not overlap the input)."""
    if out is None:
        return None
    o = check_input(out, "out")
    if not same_memory(o, whole[lo:hi]):
        return None
    if not writeable(o):
        raise ValueError("out is read-only")
    return o


def in_block(out: object, part: np.ndarray, lo: int, total: int) -> np.ndarray | None:
    """``out`` checked, if the flat input ``part`` views exactly its elements ``lo:lo +
    part.size``: an in-place allgather, whose input already lies in the rank's own block of
    the result (``MPI_IN_PLACE``'s layout for ``MPI_Allgather``, and NCCL's); else None."""
    o = check_input(out, "out")
    if o.ndim != 1 or o.size != total or o.dtype != part.dtype or \
            not same_memory(part, o[lo:lo + part.size]):
        return None
    if not writeable(o):
        raise ValueError("out is read-only")
    return o


def writeable(a: np.ndarray) -> bool:
    """Whether ``a`` may be written (CuPy arrays always may: their flags have no ``writeable``)."""
    return getattr(a.flags, "writeable", True)


def flat(a: np.ndarray) -> np.ndarray:
    """A 1-D view of a contiguous array in memory order (no copy; a 1-D array itself);
    bfloat16 as uint16 words."""
    if a.dtype.isbuiltin != 1 and is_bfloat16(a.dtype):
        return flat(a.view(np.uint16))
    if a.ndim == 1:
        return a
    return a.reshape(-1, order="F" if not a.flags.c_contiguous else "C")


def returned(x: object, out: object, result: np.ndarray | None) -> object:
    """What a public call gives back: the caller's own ``out`` when given, None where the call
    has no result (``reduce`` off the root), else ``result`` as the type of the input ``x``."""
    if result is None:
        return None
    if out is not None:
        return out
    return like(x, result)


def new_like(x: np.ndarray, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A new uninitialised result array like ``x`` (same memory order when shapes agree)."""
    if shape is None:
        return xp(x).empty_like(x)
    return xp(x).empty(shape, dtype=x.dtype)


def copy_into(src: np.ndarray, dst: np.ndarray) -> None:
    """Copy flat ``src`` into flat ``dst`` unless they are the same buffer."""
    if src is dst:
        return
    if type(dst) is np.ndarray and type(src) is np.ndarray and dst.dtype is src.dtype:
        dst[...] = src  # the common case, without np.copyto's argument parsing
    elif src.size:
        xp(dst).copyto(dst, src)


class _Memory:
    """What :func:`unowned` gives NumPy to view: an address and a layout, no owner."""

    __slots__ = ("__array_interface__",)

    def __init__(self, interface: dict) -> None:
        self.__array_interface__ = interface


def unowned(a: np.ndarray) -> np.ndarray:
    """A view of ``a``'s memory that keeps nothing alive (NumPy or CuPy, same shape, strides
    and dtype): for a remembered call on a tensor (``_runtime/repeats.py``), which uses it only
    while the tensor is alive and still reports the same memory. (A view through DLPack would
    keep the tensor's storage alive as long as the cache keeps the entry.)"""
    if type(a) is not np.ndarray:  # CuPy (CUDA tensors)
        cp = xp(a)
        memory = cp.cuda.UnownedMemory(a.data.ptr, a.nbytes, None, a.device.id)
        return cp.ndarray(a.shape, a.dtype, cp.cuda.MemoryPointer(memory, 0), a.strides)
    return np.asarray(_Memory({"data": (a.__array_interface__["data"][0], not writeable(a)),
                               "shape": a.shape, "strides": a.strides,
                               "typestr": a.dtype.str, "version": 3}))
