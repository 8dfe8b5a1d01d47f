"""Small helpers shared by codec modules (private)."""

from __future__ import annotations

import numpy as np

__all__ = ["uint_view", "inf_word", "nan_word", "param_value", "quiet", "require", "as_payload"]

_UINT_OF_SIZE = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_INF_BITS = {2: 0x7C00, 4: 0x7F800000, 8: 0x7FF0000000000000}
_NAN_BITS = {2: 0x7E00, 4: 0x7FC00000, 8: 0x7FF8000000000000}


def uint_view(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Flat unsigned-integer view of float array ``x`` and the mask that clears the sign bit."""
    size = x.dtype.itemsize
    u = x.reshape(-1).view(_UINT_OF_SIZE[size])
    return u, u.dtype.type((1 << (8 * size - 1)) - 1)


def inf_word(dtype):
    """The bits of ``+inf`` in float ``dtype``, as its unsigned integer type: a magnitude key
    (``bits & absmask``) at or above it belongs to a non-finite element (``±inf`` or NaN)."""
    size = np.dtype(dtype).itemsize
    return _UINT_OF_SIZE[size](_INF_BITS[size])


def nan_word(dtype):
    """The bits of the canonical quiet NaN of float ``dtype`` (positive, payload zero), as its
    unsigned integer type: written as an integer, it is the same on the host and on a device."""
    size = np.dtype(dtype).itemsize
    return _UINT_OF_SIZE[size](_NAN_BITS[size])


def param_value(v: float) -> float:
    """A float header parameter in canonical form: NaN as the canonical quiet NaN, ``-0.0`` as
    ``0.0`` (sums on the host and on a device may differ there, and the bytes must not)."""
    return float("nan") if v != v else v + 0.0


def quiet():
    """A context without NumPy's overflow and invalid-value warnings: arithmetic on an overflowed
    gradient makes inf and NaN on purpose (they propagate; a warning turned into an error on one
    rank would hang a collective)."""
    return np.errstate(over="ignore", invalid="ignore")


def require(cond: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``cond``."""
    if not cond:
        raise ValueError(message)


def as_payload(payload) -> np.ndarray:
    if isinstance(payload, (bytes, bytearray, memoryview)):
        payload = np.frombuffer(payload, dtype=np.uint8)
    if not isinstance(payload, np.ndarray):
        raise TypeError(f"payload must be a uint8 numpy array or bytes, not {type(payload).__name__}")
    if payload.dtype != np.uint8 or payload.ndim != 1:
        raise TypeError(f"payload must be a 1-D uint8 array, got {payload.ndim}-D {payload.dtype}")
    if not payload.flags.c_contiguous or payload.ctypes.data % 8:
        payload = payload.copy()
    return payload


def k_for(n: int, ratio: float) -> int:
    """Number of kept elements for density ``ratio``: ``ceil(ratio * n)``, at least 1 when n > 0."""
    if n == 0:
        return 0
    return min(n, max(1, int(np.ceil(ratio * n - 1e-9))))


def check_ratio(name: str, ratio: float) -> None:
    """``ValueError`` unless ``0 < ratio <= 1``."""
    require(0.0 < ratio <= 1.0, f"{name} must be in (0, 1], got {ratio!r}")


def check_padding(last_byte: int, nbits: int) -> None:
    """``ValueError`` unless the bits beyond the first ``nbits`` of a packed bit array are zero,
    given its last byte (``ops.last_byte(packed)``: 0 for an empty array)."""
    used = nbits & 7
    if used and last_byte >> used:
        raise ValueError("nonzero padding bits after the last packed element")


