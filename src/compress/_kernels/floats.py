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

__all__ = ["to_f16_word", "to_bf16_word", "f16_to_f32_word", "f32_to_f16_bits", "f32_to_bf16_bits", "bf16_bits_to_f32",
           "table_lookup"]


@njit(**NJIT)
def to_f16_word(f, mbits, bias):
    """Binary16 word nearest to the float whose bits are ``f`` (int64; ``mbits`` mantissa bits and
    exponent ``bias``: 23/127 for float32, 52/1023 for float64), ties to even."""
    ebits = 8 if mbits == 23 else 11
    sign = (f >> (mbits + ebits - 15)) & 0x8000
    a = f & (np.int64(0x7FFFFFFFFFFFFFFF) >> (63 - mbits - ebits))
    drop = mbits - 10
    # normal half: rebias the exponent, round to nearest even, drop the extra mantissa bits
    normal = (a - (np.int64(bias - 15) << mbits) + ((np.int64(1) << (drop - 1)) - 1)
              + ((a >> drop) & 1)) >> drop
    # subnormal half: value * 2**24 = significand >> (bias + mbits - 24 - e), rounded to nearest even
    e = a >> mbits
    m = (a & ((np.int64(1) << mbits) - 1)) | (np.int64(1) << mbits)
    shift = min(bias + mbits - 24 - e, 62)
    q = m >> shift
    rem = m & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    q += np.int64(rem > half) | (np.int64(rem == half) & (q & 1))
    o = normal if a >= (np.int64(bias - 14) << mbits) else q
    big = 0x7E00 if a > (np.int64(2 * bias + 1) << mbits) else 0x7C00
    o = big if a >= (np.int64(bias + 16) << mbits) else o
    return o | sign


@njit(**NJIT)
def f32_to_f16_bits(src, dst):
    """Round float32 words ``src`` (uint32 view) to binary16 words ``dst`` (uint16)."""
    for i in range(src.size):
        dst[i] = to_f16_word(np.int64(src[i]), 23, 127)


@njit(**NJIT)
def to_bf16_word(f):
    """Bfloat16 word of the float32 whose bits are ``f`` (int64): nearest even, NaN stays quiet."""
    rounded = (f + 0x7FFF + ((f >> 16) & 1)) >> 16
    nan = (f >> 16) | 0x40
    return nan if (f & 0x7FFFFFFF) > 0x7F800000 else rounded


@njit(**NJIT)
def f32_to_bf16_bits(src, dst):
    """Round float32 words ``src`` (uint32 view) to bfloat16 words ``dst`` (uint16)."""
    for i in range(src.size):
        dst[i] = to_bf16_word(np.int64(src[i]))


@njit(**NJIT)
def f16_to_f32_word(h):
    """Float32 bits of the binary16 word ``h`` (int64); exact, NaN payloads kept (NumPy's rule).

    The host decodes through a table; the device twin computes it."""
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        return sign | 0x7F800000 | (m << 13)
    if e == 0:
        if m == 0:
            return sign
        e = 113
        while (m & 0x400) == 0:
            m <<= 1
            e -= 1
        return sign | (e << 23) | ((m & 0x3FF) << 13)
    return sign | ((e + 112) << 23) | (m << 13)


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

