"""Quantization kernels (private).

``quantize_levels`` is shared by QSGD, TernGrad and the 8-bit codec. The input is cut into buckets of
``bucket`` elements; each bucket gets a scale (its L2 norm, or its max magnitude) and every element
``x`` becomes a signed level ``q`` in ``[-s, s]`` with ``|x| / scale * s`` rounded either to nearest
or stochastically (up with probability equal to the fractional part, which is unbiased). The stored
code is ``q + s`` in ``[0, 2s]``, packed LSB-first with ``bits`` bits per element (byte-aligned fast
path when ``bits == 8``). Stochastic rounding draws ``uniform24(i, seed_lo, seed_hi)`` for global element
index ``i``.

A bucket holding ``±inf`` or NaN gets a non-finite scale, all codes ``s`` (level 0), and decodes to NaN.

``natural_encode`` rounds ``|x|`` (float32) to one of the two neighbouring powers of two,
up with probability ``mantissa / 2**23`` (Horvath et al. 2019), which is unbiased also for subnormals.
"""

import numpy as np
from numba import njit

from . import NJIT, NJIT_REDUCE
from .bits import pack_codes, unpack_codes
from .rng import uniform24

__all__ = [
    "level_code",
    "scale_is_finite",
    "natural_exponent",
    "quantize_levels",
    "dequantize_levels",
    "natural_encode",
    "natural_decode",
    "signed_sums",
]

_INV24 = 1.0 / 16777216.0


@njit(**NJIT)
def _bucket_scale(x, lo, hi, use_max):
    acc = 0.0
    if use_max:
        # max drops a NaN met after the first element; nonfinite (0, or NaN once a non-finite
        # element is met: inf * 0 is NaN) makes the scale NaN then, without a branch in the loop
        nonfinite = 0.0
        for i in range(lo, hi):
            v = np.float64(x[i])
            acc = max(acc, abs(v))
            nonfinite += v * 0.0
        return acc + nonfinite
    for i in range(lo, hi):
        v = np.float64(x[i])
        acc += v * v
    return np.sqrt(acc)


@njit(**NJIT)
def level_code(v, mult, s, stochastic, i, seed_lo, seed_hi):
    """Code ``q + s`` of element ``i`` with value ``v``: ``|v| * mult`` rounded (stochastically or to
    nearest) to a level ``q`` in ``[0, s]``, signed like ``v``. Only for buckets whose scale is
    finite (see :func:`scale_is_finite`), where ``v`` is finite too."""
    r = abs(v) * mult
    if stochastic:
        r += np.float64(uniform24(i, seed_lo, seed_hi)) * _INV24
    else:
        r += 0.5
    lev = min(np.int64(r), s)
    return s - lev if v < 0 else s + lev


@njit(**NJIT)
def scale_is_finite(scale):
    """Whether a stored bucket scale is finite; a bucket whose scale is not (it held ``±inf`` or
    NaN, or its L2 norm overflowed) gets every code ``s`` (level 0) and decodes to NaN."""
    return scale <= 1.7976931348623157e308


@njit(**NJIT)
def quantize_levels(x, bucket, s, use_max, stochastic, seed_lo, seed_hi, bits, scales, out):
    """Quantize ``x`` into ``scales`` (one per bucket) and the packed code stream ``out``.

    A bucket holding a non-finite element has a non-finite scale (its maximum, made NaN, or its
    L2 norm), as has one whose L2 norm overflows the scale's type; every code of it is then ``s``
    (level 0), and it decodes to ``0 * scale`` = NaN. (The caller stores such scales as the
    canonical NaN.)"""
    n = x.size
    nb = scales.size
    codes = np.empty(min(bucket, n), dtype=np.uint16)
    bitpos = 0
    for b in range(nb):
        lo = b * bucket
        hi = min(lo + bucket, n)
        scales[b] = _bucket_scale(x, lo, hi, use_max)
        scale = np.float64(scales[b])  # the value the decoder will see
        if scale_is_finite(scale):
            mult = s / scale if scale > 0.0 else 0.0
            for i in range(lo, hi):
                codes[i - lo] = level_code(np.float64(x[i]), mult, s, stochastic, i, seed_lo, seed_hi)
        else:
            codes[: hi - lo] = s
        if bits == 8:
            for i in range(lo, hi):
                out[i] = codes[i - lo]
        else:
            bitpos = pack_codes(codes[: hi - lo], bits, out, bitpos)


@njit(**NJIT)
def dequantize_levels(packed, bits, s, bucket, scales, out):
    """Inverse of :func:`quantize_levels`; returns the number of codes above ``2s`` (invalid)."""
    n = out.size
    bad = 0
    codes = np.empty(min(bucket, n), dtype=np.int64)
    for b in range(scales.size):
        lo = b * bucket
        hi = min(lo + bucket, n)
        step = np.float64(scales[b]) / s
        if bits == 8:
            for i in range(lo, hi):
                codes[i - lo] = packed[i]
        else:
            unpack_codes(packed, bits, lo * bits, codes[: hi - lo])
        for i in range(lo, hi):
            c = codes[i - lo]
            bad += c > 2 * s
            out[i] = (c - s) * step
    return bad


@njit(**NJIT)
def natural_exponent(f, i, seed_lo, seed_hi):
    """Exponent field of element ``i`` (float32 bits ``f``) after stochastic power-of-two rounding."""
    a = f & 0x7FFFFFFF
    e = a >> 23
    mant = a & 0x7FFFFF
    up = np.int64(np.int64(uniform24(i, seed_lo, seed_hi) >> np.uint64(1)) < mant)
    return e + up if e < 255 else e


@njit(**NJIT)
def natural_encode(u, seed_lo, seed_hi, exps):
    """Stochastic power-of-two exponents of float32 words ``u`` (uint32 view) into ``exps``."""
    for i in range(u.size):
        exps[i] = natural_exponent(np.int64(u[i]), i, seed_lo, seed_hi)


@njit(**NJIT)
def natural_decode(exps, signs, out):
    """Float32 words ``sign | exponent << 23`` (zero mantissa) from exponents and sign bits."""
    for i in range(out.size):
        sign = np.int64((signs[i >> 3] >> (i & 7)) & 1)
        e = np.int64(exps[i])
        out[i] = (sign << 31) | (e << 23) if e > 0 else 0


@njit(**NJIT_REDUCE)
def signed_sums(x):
    """``(sum of max(x, 0), sum of min(x, 0))`` in float64, reassociated for SIMD.

    The scales of EF-signSGD (``(pos - neg) / n``) and 1-bit SGD (the mean of each part) come from
    these; summing each part directly avoids the cancellation of ``(|x| + x) / 2``. ``max(v, 0.0)``
    is ``0.0 if 0.0 > v else v`` (Numba's), so a NaN reaches both sums and ``±inf`` the sum of its
    sign (``nnan`` and ``ninf`` stay off); ``±0.0`` adds nothing to either. (A select written as
    ``v if v >= 0 else 0.0`` does not vectorize; docs/benchmarks.md, "Numbers behind the code".)
    """
    pos = 0.0
    neg = 0.0
    for i in range(x.size):
        v = np.float64(x[i])
        pos += max(v, 0.0)
        neg += min(v, 0.0)
    return pos, neg
