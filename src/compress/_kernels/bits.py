"""Bit packing kernels (private).

Bits are stored LSB-first: element ``i`` lands in byte ``(i * b) // 8`` starting at bit
``(i * b) % 8``, and a code wider than the rest of a byte continues in the next byte.
``pack_sign_bits`` stores the IEEE sign bit of each element (natural compression's sign, where
``-0.0`` has its bit set); ``pack_negative_bits`` sets the bit of the elements that are negative by
value, ``x < 0`` (the sign codecs' split: ``-0.0`` and NaN are not negative).
"""

import numpy as np
from numba import njit

from . import NJIT

__all__ = ["pack_sign_bits", "pack_negative_bits", "negative_word", "unpack_two_values", "pack_codes",
           "unpack_codes"]


@njit(**NJIT)
def pack_sign_bits(u, shift, out):
    """Pack bit ``shift`` (the sign bit) of every word of ``u`` into ``out`` (uint8, ceil(n/8))."""
    n = u.size
    nfull = n // 8
    s = u.dtype.type(shift)
    one = u.dtype.type(1)
    for j in range(nfull):
        b = 0
        base = j * 8
        for t in range(8):
            b |= np.int64((u[base + t] >> s) & one) << t
        out[j] = b
    if n > nfull * 8:
        b = 0
        for t in range(n - nfull * 8):
            b |= np.int64((u[nfull * 8 + t] >> s) & one) << t
        out[nfull] = b


@njit(**NJIT)
def negative_word(w, absmask, inf, shift):
    """1 if the float whose bits are ``w`` is negative by value (sign bit set, and neither a zero
    nor NaN: ``0 < |w| <= inf``), else 0. ``inf`` is the bit pattern of +infinity."""
    key = w & absmask
    return np.int64((w >> shift) & 1) & np.int64(key != 0) & np.int64(key <= inf)


@njit(**NJIT)
def pack_negative_bits(u, absmask, inf, shift, out):
    """Bit ``i`` of ``out`` (LSB-first, zero padding) = ``x[i] < 0`` for the float words ``u`` (an
    unsigned view); returns the number of non-finite elements (magnitude key ``>= inf``), counted
    in the same pass."""
    n = u.size
    nfull = n // 8
    s = u.dtype.type(shift)
    bad = 0
    for j in range(nfull):
        b = 0
        base = j * 8
        for t in range(8):
            w = u[base + t]
            b |= negative_word(w, absmask, inf, s) << t
            bad += (w & absmask) >= inf
        out[j] = b
    if n > nfull * 8:
        b = 0
        for t in range(n - nfull * 8):
            w = u[nfull * 8 + t]
            b |= negative_word(w, absmask, inf, s) << t
            bad += (w & absmask) >= inf
        out[nfull] = b
    return bad


@njit(**NJIT)
def unpack_two_values(packed, pos_value, neg_value, out):
    """Write ``neg_value`` where the bit of ``packed`` is set, ``pos_value`` elsewhere."""
    n = out.size
    for i in range(n):
        bit = (packed[i >> 3] >> (i & 7)) & 1
        out[i] = neg_value if bit else pos_value


@njit(**NJIT)
def pack_codes(codes, bits, out, bitpos):
    """Append ``bits``-wide ``codes`` to the LSB-first stream ``out`` starting at bit ``bitpos``.

    Bits beyond the appended codes in the last touched byte are preserved (they must be zero when
    the stream is written front to back). Returns the new bit position.
    """
    o = bitpos >> 3
    nacc = bitpos & 7
    acc = np.int64(out[o]) & ((1 << nacc) - 1) if nacc else np.int64(0)
    for i in range(codes.size):
        acc |= np.int64(codes[i]) << nacc
        nacc += bits
        while nacc >= 8:
            out[o] = acc & 0xFF
            o += 1
            acc >>= 8
            nacc -= 8
    if nacc > 0:
        out[o] = acc & 0xFF
    return bitpos + codes.size * bits


@njit(**NJIT)
def unpack_codes(packed, bits, start, codes):
    """Read ``codes.size`` codes of width ``bits`` from the stream ``packed`` starting at ``start``."""
    o = start >> 3
    nacc = 0
    acc = np.int64(0)
    skip = start & 7
    mask = (np.int64(1) << bits) - 1
    if skip:
        acc = np.int64(packed[o]) >> skip
        nacc = 8 - skip
        o += 1
    for i in range(codes.size):
        while nacc < bits:
            acc |= np.int64(packed[o]) << nacc
            o += 1
            nacc += 8
        codes[i] = acc & mask
        acc >>= bits
        nacc -= bits
