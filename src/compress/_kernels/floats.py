"""Float format conversion kernels (private).

``to_f16_word`` rounds a float32 or float64 to IEEE half precision to nearest-even entirely in
integer arithmetic (no float16 support needed, so the device kernels use it too): normal results
add the exponent rebias plus a rounding bias of ``0xFFF + odd`` before shifting out the extra
mantissa bits; results in the half subnormal range shift the significand right and round by the
remainder; overflow gives infinity and NaN the quiet NaN ``0x7E00`` with its sign. On the host,
``f32_to_f16_bits`` gives the same words with the processor's conversion (F16C; its speed:
docs/benchmarks/codecs.md), and ``f16_to_f32_bits`` widens with it, keeping a NaN's payload as
NumPy's cast does.
``f32_to_bf16_bits`` is the usual round-to-nearest-even on the upper 16 bits of float32.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from . import NJIT

__all__ = ["to_f16_word", "to_bf16_word", "f16_to_f32_word", "f32_to_f16_bits", "f16_to_f32_bits",
           "f32_to_bf16_bits", "bf16_bits_to_f32",
           "half_to_float", "float_to_half", "combine_half", "HALF_OPS"]


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
def f32_to_f16_bits(x, words, dst):
    """Round float32 ``x`` (``words``: its uint32 view) to binary16 words ``dst`` (uint16): the
    processor's conversion (nearest even, subnormals, overflow to infinity), and a NaN as the
    quiet NaN ``0x7E00`` with its sign: the words of :func:`to_f16_word` (the device's), for
    every input. The select instead of a branch keeps the loop SIMD code."""
    for i in range(x.size):
        w = words[i]
        nan = np.uint16(((w >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7E00))
        h = float_to_half(x[i])
        dst[i] = nan if (w & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else h


@njit(**NJIT)
def f16_to_f32_bits(half, dst):
    """Widen binary16 words ``half`` to float32 words ``dst`` (uint32 view): the processor's
    conversion (exact), except NaN, whose payload is kept as it is (a signalling NaN stays one;
    the processor would quiet it): the bits of NumPy's cast, for every word."""
    for i in range(half.size):
        h = half[i]
        wide = np.float32(half_to_float(h)).view(np.uint32)
        nan = ((np.uint32(h & np.uint16(0x8000)) << np.uint32(16)) | np.uint32(0x7F800000)
               | (np.uint32(h & np.uint16(0x3FF)) << np.uint32(13)))
        isnan = (h & np.uint16(0x7C00)) == np.uint16(0x7C00) and (h & np.uint16(0x3FF)) != 0
        dst[i] = nan if isnan else wide


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



@intrinsic
def half_to_float(typingctx, bits):
    """The float32 value of a binary16 word (uint16), by the processor's conversion (exact)."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def float_to_half(typingctx, value):
    """The binary16 word (uint16) nearest a float32 value, ties to even, as NumPy rounds."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(value), codegen


#: The operations of :func:`combine_half`, by code.
HALF_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3}
_H_SUM, _H_PROD, _H_MIN, _H_MAX = HALF_OPS["sum"], HALF_OPS["prod"], HALF_OPS["min"], HALF_OPS["max"]
#: Elements :func:`combine_half` computes at a time into a buffer of its own.
HALF_BLOCK = 2048


@njit(inline="always")
def _half_as_numpy(op, x, y):  # pragma: no cover - compiled
    # NumPy's float16 loops on the words x, y: sum and product in float32, rounded, and a NaN
    # second operand is the result (quieted) even when the first is NaN too, where x86 would
    # keep the first's; minimum and maximum return an operand's own word (a signalling NaN
    # unchanged), the first when it is <= (>=) the second or NaN: min(-0.0, 0.0) is -0.0
    a, b = half_to_float(x), half_to_float(y)
    if op == _H_SUM:
        return float_to_half(b + b if b != b else a + b)
    if op == _H_PROD:
        return float_to_half(b * b if b != b else a * b)
    if op == _H_MIN:
        return x if (a <= b or a != a) else y
    return x if (a >= b or a != a) else y


@njit(**NJIT)
def combine_half(op, lower, higher, out):  # pragma: no cover - compiled
    """``out[i] = lower[i] op higher[i]`` (``op`` a code of :data:`HALF_OPS`) on float16 data
    given as uint16 words, with the bits of NumPy's float16 ufuncs; ``out`` may be either
    operand. In blocks through a buffer of its own, so that the loops vectorize in place too."""
    block = np.empty(HALF_BLOCK, np.uint16)
    for lo in range(0, out.size, HALF_BLOCK):
        c = min(HALF_BLOCK, out.size - lo)
        x, y = lower[lo:lo + c], higher[lo:lo + c]
        if op == _H_SUM:  # one loop per op, each vectorized
            for i in range(c):
                block[i] = _half_as_numpy(_H_SUM, x[i], y[i])
        elif op == _H_PROD:
            for i in range(c):
                block[i] = _half_as_numpy(_H_PROD, x[i], y[i])
        elif op == _H_MIN:
            for i in range(c):
                block[i] = _half_as_numpy(_H_MIN, x[i], y[i])
        else:
            for i in range(c):
                block[i] = _half_as_numpy(_H_MAX, x[i], y[i])
        out[lo:lo + c] = block[:c]
