"""Float format conversion kernels (private).

``f32_to_f16_bits`` rounds float32 to IEEE half precision to nearest-even entirely in integer
arithmetic (no float16 support needed from Numba, and the loop vectorizes): normal results add the
exponent rebias plus a rounding bias of ``0xFFF + odd`` before shifting out 13 mantissa bits; results in
the half subnormal range shift the 24-bit significand right by ``126 - e`` and round by the remainder;
overflow gives infinity and NaN stays a (quiet) NaN. Half-to-float goes through a 65536-entry table.
``f32_to_bf16_bits`` is the usual round-to-nearest-even on the upper 16 bits of float32.
"""

import numpy as np
from numba import njit

from . import NJIT

__all__ = ["f32_to_f16_bits", "f32_to_bf16_bits", "bf16_bits_to_f32", "table_lookup"]


@njit(**NJIT)
def f32_to_f16_bits(src, dst):
    """Round float32 words ``src`` (uint32 view) to binary16 words ``dst`` (uint16)."""
    for i in range(src.size):
        f = np.int64(src[i])
        sign = (f >> 16) & 0x8000
        a = f & 0x7FFFFFFF
        # normal half: rebias exponent (-112 << 23), round to nearest even, drop 13 mantissa bits
        normal = (a - (112 << 23) + 0xFFF + ((a >> 13) & 1)) >> 13
        # subnormal half: value * 2**24 = significand >> (126 - e), rounded to nearest even
        e = a >> 23
        m = (a & 0x7FFFFF) | 0x800000
        shift = min(126 - e, 31)
        q = m >> shift
        rem = m & ((np.int64(1) << shift) - 1)
        half = np.int64(1) << (shift - 1)
        q += np.int64(rem > half) | (np.int64(rem == half) & (q & 1))
        o = normal if a >= (113 << 23) else q
        big = 0x7E00 if a > 0x7F800000 else 0x7C00
        o = big if a >= (143 << 23) else o
        dst[i] = o | sign


@njit(**NJIT)
def f32_to_bf16_bits(src, dst):
    """Round float32 words ``src`` (uint32 view) to bfloat16 words ``dst`` (uint16)."""
    for i in range(src.size):
        f = np.int64(src[i])
        rounded = (f + 0x7FFF + ((f >> 16) & 1)) >> 16
        nan = (f >> 16) | 0x40
        dst[i] = nan if (f & 0x7FFFFFFF) > 0x7F800000 else rounded


@njit(**NJIT)
def bf16_bits_to_f32(src, dst):
    """Widen bfloat16 words ``src`` (uint16) to float32 words ``dst`` (uint32 view); exact."""
    for i in range(src.size):
        dst[i] = np.uint32(src[i]) << np.uint32(16)


@njit(**NJIT)
def table_lookup(src, table, dst):
    """``dst[i] = table[src[i]]`` for a table that covers every value of ``src``'s dtype."""
    for i in range(src.size):
        dst[i] = table[src[i]]

