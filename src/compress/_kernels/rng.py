"""Counter-based random numbers for kernels (private).

A counter-based generator maps ``(stream, counter)`` to a random word with a pure function, so element
``i`` always gets the same random number no matter how the loop is split, and loops stay free of
sequential generator state (they vectorize). ``mix32`` is Chris Wellons' "lowbias32" integer hash;
``splitmix64`` is the SplitMix64 output function (Steele, Lea & Flood 2014).
"""

import numpy as np
from numba import njit

from . import NJIT

__all__ = ["mix32", "uniform24", "splitmix64", "uniform_below"]

_M32 = np.uint64(0xFFFFFFFF)
_ODD32 = np.uint64(0x9E3779B9)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


@njit(**NJIT)
def mix32(x):
    """Lowbias32 hash of the low 32 bits of ``x`` (returned as uint64 < 2**32)."""
    x = np.uint64(x) & _M32
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & _M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & _M32
    x ^= x >> np.uint64(16)
    return x


@njit(**NJIT)
def uniform24(i, seed_lo, seed_hi):
    """Uniform integer in ``[0, 2**24)`` for counter ``i`` of stream ``(seed_lo, seed_hi)``.

    The low 32 bits of ``i`` go into the first round and the high bits, times an odd constant, into
    the second, so counters ``2**32`` apart draw different numbers (and every counter below
    ``2**32`` draws what it always did)."""
    h = mix32((np.uint64(i) & _M32) ^ np.uint64(seed_lo))
    h = mix32(h + np.uint64(seed_hi) + (np.uint64(i) >> np.uint64(32)) * _ODD32)
    return h >> np.uint64(8)


@njit(**NJIT)
def splitmix64(z):
    """SplitMix64 finaliser of ``z`` (uint64 in, uint64 out)."""
    z = np.uint64(z) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _C1
    z = (z ^ (z >> np.uint64(27))) * _C2
    return z ^ (z >> np.uint64(31))


@njit(**NJIT)
def uniform_below(stream, counter, bound):
    """Uniform integer in ``[0, bound)`` from 53 random bits (bias below ``bound / 2**53``)."""
    h = splitmix64(np.uint64(stream) ^ splitmix64(np.uint64(counter)))
    u = np.float64(h >> np.uint64(11)) * (1.0 / 9007199254740992.0)
    r = np.int64(u * bound)
    if r >= bound:  # cannot happen for u < 1, kept as a guard
        r = bound - 1
    return r
