"""Small helpers shared by codec modules (private)."""

from __future__ import annotations

import numpy as np

__all__ = ["uint_view", "require", "as_payload"]

_UINT_OF_SIZE = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def uint_view(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Flat unsigned-integer view of float array ``x`` and the mask that clears the sign bit."""
    size = x.dtype.itemsize
    u = x.reshape(-1).view(_UINT_OF_SIZE[size])
    return u, u.dtype.type((1 << (8 * size - 1)) - 1)


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


