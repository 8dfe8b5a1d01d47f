"""Seeds, tensor keys and per-encode random streams (private).

Random codecs draw one 64-bit *stream* per encode and record it in the header, so decoding never
needs the encoder's generator. Private randomness (QSGD, TernGrad, natural, DGC's sample) comes from a
``np.random.Generator``; shared randomness (random-k, whose indices every rank must agree on) is a pure
function of ``(seed, key, step)``.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["make_generator", "draw_stream", "key_to_u64", "shared_stream", "split_stream"]

_M64 = (1 << 64) - 1


def make_generator(seed) -> np.random.Generator:
    """A Generator from ``None``, an int seed or an existing Generator."""
    if seed is None or isinstance(seed, (int, np.integer)):
        return np.random.default_rng(seed)
    if isinstance(seed, np.random.Generator):
        return seed
    raise TypeError(f"seed must be None, an int or a numpy.random.Generator, not {type(seed).__name__}")


def draw_stream(rng: np.random.Generator) -> int:
    """A fresh 64-bit stream id from ``rng``."""
    return int(rng.integers(0, 1 << 64, dtype=np.uint64))


def _mix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def key_to_u64(key) -> int:
    """Stable 64-bit id of a tensor key (None, int, str or bytes); independent of PYTHONHASHSEED."""
    if key is None:
        return 0
    if isinstance(key, (int, np.integer)):
        return int(key) & _M64
    if isinstance(key, str):
        key = key.encode()
    if isinstance(key, bytes):
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    raise TypeError(f"key must be None, an int, a str or bytes, not {type(key).__name__}")


def shared_stream(seed: int, key, step: int) -> int:
    """Stream id that depends only on ``(seed, key, step)``: equal on every rank."""
    return _mix64(_mix64(_mix64(int(seed) & _M64) ^ key_to_u64(key)) ^ (int(step) & _M64))


def split_stream(stream: int) -> tuple[int, int]:
    """The two 32-bit halves used by the counter-based kernels."""
    return stream & 0xFFFFFFFF, stream >> 32
