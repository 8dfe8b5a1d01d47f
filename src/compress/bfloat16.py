"""bfloat16 arithmetic on raw 16-bit words, on the host or a device.

bfloat16 has no MPI type and NumPy's loops for it (``ml_dtypes``) are slow, so the library moves and
reduces it as ``uint16`` words: :func:`widen` gives their float32 values (exact), and
:func:`on_words` applies a float32 ufunc and rounds the result back to bfloat16, nearest even, as
NCCL rounds every bf16 operation (:func:`narrow` rounds float32 values alone). The ``bf16`` codec
sums its payloads with :func:`add_words`; ``collectives.ops`` builds the word form of every
reduction from :func:`on_words` and :func:`divide_words`.
"""

from __future__ import annotations

import numpy as np

from ._backends import backend_of

__all__ = ["widen", "narrow", "on_words", "divide_words", "add_words"]


def widen(words: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 words (exact), host or CuPy."""
    return (words.astype(np.uint32) << 16).view(np.float32)


def narrow(values: np.ndarray, out: np.ndarray) -> None:
    """float32 ``values`` rounded to bfloat16 words (nearest even) into ``out``, host or CuPy."""
    backend_of(out).to_bf16(values, out)


def on_words(ufunc: np.ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = ufunc(a, b)`` on raw bfloat16 words: widen to float32 (exact), apply, round to
    nearest even, as NCCL rounds every bf16 operation; ``out`` may alias ``a`` or ``b``."""
    backend_of(a).to_bf16(ufunc(widen(a), widen(b)), out)


def divide_words(words: np.ndarray, divisor: int) -> None:
    """``words /= divisor`` in place on bfloat16 words (in float32, rounded once)."""
    backend_of(words).to_bf16(widen(words) / np.float32(divisor), words)


def add_words(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """bfloat16 addition on raw uint16 words: widen to float32 (exact), add, round to nearest even.

    The summable protocol's combine for bf16 (NumPy's calling convention ``f(a, b, out=)``), for
    host or CuPy arrays.
    """
    on_words(np.add, a, b, out)
