"""Element-wise device kernels: float formats, fills, gathers and scatters (private).

Each thread handles elements ``i, i + stride, ...`` of a grid-stride loop; the per-element arithmetic is
the host kernels' (see :mod:`compress._kernels.cuda.scalar`).
"""

import numpy as np
from numba import cuda

from .scalar import f16_to_f32_word, natural_exponent, to_bf16_word, to_f16_word

__all__ = ["fill", "to_f16", "to_bf16", "bf16_to_f32", "f16_to_f32", "gather", "scatter",
           "scatter_scaled", "natural_encode", "natural_decode", "unpack_two_values",
           "threshold_words", "threshold_decode", "gather_all", "threshold_parts"]


@cuda.jit
def fill(out, value):
    """``out[:] = value``."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        out[i] = value


@cuda.jit
def to_f16(src, mbits, bias, dst):
    """Binary16 words ``dst`` of the float words ``src`` (uint32 or uint64 view); see ``to_f16_word``."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, src.size, stride):
        dst[i] = to_f16_word(np.int64(src[i]), mbits, bias)


@cuda.jit
def to_bf16(src, dst):
    """Bfloat16 words ``dst`` of float32 words ``src``."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, src.size, stride):
        dst[i] = to_bf16_word(np.int64(src[i]))


@cuda.jit
def bf16_to_f32(src, dst):
    """Float32 words ``dst`` of bfloat16 words ``src`` (exact)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, src.size, stride):
        dst[i] = np.uint32(src[i]) << np.uint32(16)


@cuda.jit
def f16_to_f32(src, dst):
    """Float32 words ``dst`` of binary16 words ``src`` (exact)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, src.size, stride):
        dst[i] = f16_to_f32_word(np.int64(src[i]))


@cuda.jit
def gather(src, idx, out):
    """``out[j] = src[idx[j]]`` (indices valid)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for j in range(start, idx.size, stride):
        out[j] = src[idx[j]]


@cuda.jit
def scatter(vals, idx, out):
    """``out[idx[j]] = vals[j]`` (indices validated by the caller)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for j in range(start, idx.size, stride):
        out[idx[j]] = vals[j]


@cuda.jit
def scatter_scaled(vals, idx, scale, out):
    """``out[idx[j]] = vals[j] * scale`` (indices validated by the caller)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for j in range(start, idx.size, stride):
        out[idx[j]] = vals[j] * scale


@cuda.jit
def natural_encode(u, seed_lo, seed_hi, exps):
    """Stochastic power-of-two exponents of float32 words ``u`` (host: ``natural_encode``)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, u.size, stride):
        exps[i] = natural_exponent(np.int64(u[i]), i, seed_lo, seed_hi)


@cuda.jit
def natural_decode(exps, signs, out):
    """Float32 words ``sign | exponent << 23`` (host: ``natural_decode``)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        sign = np.int64((signs[i >> 3] >> (i & 7)) & 1)
        e = np.int64(exps[i])
        out[i] = (sign << 31) | (e << 23) if e > 0 else 0


@cuda.jit
def unpack_two_values(packed, pos_value, neg_value, out):
    """``neg_value`` where the bit of ``packed`` is set, ``pos_value`` elsewhere."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        out[i] = neg_value if (packed[i >> 3] >> (i & 7)) & 1 else pos_value


@cuda.jit
def threshold_words(idx, u, shift, words):
    """Strom's words ``index << 1 | sign bit`` of the selected elements."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for j in range(start, idx.size, stride):
        i = idx[j]
        words[j] = (np.uint32(i) << np.uint32(1)) | np.uint32((u[i] >> shift) & 1)


@cuda.jit
def threshold_decode(words, pos_word, neg_word, out):
    """``out[word >> 1] = neg_word if word & 1 else pos_word`` (words validated by the caller)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for j in range(start, words.size, stride):
        w = words[j]
        out[w >> np.uint32(1)] = neg_word if w & np.uint32(1) else pos_word


@cuda.jit
def gather_all(src, out):
    """``out[i] = src[i]`` with the element types' conversion (e.g. int64 indices to uint32)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        out[i] = src[i]


@cuda.jit
def threshold_parts(words, pos_word, neg_word, idx, vals):
    """``idx[j] = words[j] >> 1`` and ``vals[j]`` = the ``±tau`` word of its sign bit."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for j in range(start, words.size, stride):
        w = words[j]
        idx[j] = w >> np.uint32(1)
        vals[j] = neg_word if w & np.uint32(1) else pos_word
