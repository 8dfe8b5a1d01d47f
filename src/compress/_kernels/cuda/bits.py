"""Bit-packing device kernels (private): the host layout of :mod:`compress._kernels.bits`.

Bits are LSB-first. Packing gives each thread one *output byte* and has it collect the bits that land
there, so no two threads write the same byte and no atomics are needed; unpacking gives each thread one
element, which reads the (at most three) bytes its code spans.
"""

import numpy as np
from numba import cuda

from .scalar import negative_word

__all__ = ["pack_sign_bits", "pack_negative_bits", "pack_codes", "code_at"]


@cuda.jit
def pack_sign_bits(u, shift, out):
    """Byte ``j`` of ``out`` holds bit ``shift`` of words ``8j .. 8j+7`` of ``u`` (zero padding)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    n = u.size
    for j in range(start, out.size, stride):
        b = 0
        for t in range(8):
            i = 8 * j + t
            if i < n:
                b |= np.int64((u[i] >> shift) & 1) << t
        out[j] = b


@cuda.jit
def pack_negative_bits(u, absmask, inf, shift, out, nonfinite):
    """Byte ``j`` of ``out`` holds ``x < 0`` of words ``8j .. 8j+7`` of ``u`` (host:
    ``pack_negative_bits``; zero padding); ``nonfinite[0] +=`` the number of non-finite words (one
    atomic add per thread that met any)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    n = u.size
    bad = 0
    for j in range(start, out.size, stride):
        b = 0
        for t in range(8):
            i = 8 * j + t
            if i < n:
                b |= negative_word(u[i], absmask, inf, shift) << t
                bad += (u[i] & absmask) >= inf
        out[j] = b
    if bad:
        cuda.atomic.add(nonfinite, 0, bad)


@cuda.jit
def pack_codes(codes, bits, out):
    """Byte ``j`` of the LSB-first stream of ``bits``-wide ``codes`` (zero padding)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    n = codes.size
    for j in range(start, out.size, stride):
        lo = 8 * j
        acc = np.int64(0)
        for i in range(lo // bits, min(n, (lo + 7) // bits + 1)):
            off = i * bits - lo
            c = np.int64(codes[i])
            acc |= (c << off) if off >= 0 else (c >> -off)
        out[j] = acc & 0xFF


@cuda.jit(device=True)
def code_at(packed, bits, i):
    """Code ``i`` of the LSB-first stream ``packed`` of ``bits``-wide codes (``bits <= 16``)."""
    pos = i * bits
    o = pos >> 3
    acc = np.int64(packed[o])
    if o + 1 < packed.size:
        acc |= np.int64(packed[o + 1]) << 8
    if o + 2 < packed.size:
        acc |= np.int64(packed[o + 2]) << 16
    return (acc >> (pos & 7)) & ((np.int64(1) << bits) - 1)
