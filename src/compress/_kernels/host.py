"""The host backend's operations: what a codec calls, on NumPy arrays (private).

:mod:`compress._kernels.cuda.ops` has a function of the same name and calling convention for each of
these (plus the owning :class:`compress._backends.cuda.Device` as its last argument), so a codec's
encode and decode are written once against either (:mod:`compress._backends`). Importing this module
imports Numba and defines the ``@njit`` kernels; :data:`compress._backends.HOST` does that on the
first use of an operation, never at ``import compress``.
"""

from __future__ import annotations

import numpy as np

from .._util import inf_word, nan_word, quiet, uint_view
from .. import compile_notice
from . import bits, floats, fused, quant, sources, sparse
from .bits import pack_sign_bits, unpack_two_values
from .quant import dequantize_levels, natural_decode, natural_encode
from .sparse import count_at_least, first_bad_index, gather, scatter, scatter_scaled

__all__ = ["float_work", "sign_stats", "pack_sign_bits", "pack_negative_bits", "unpack_two_values", "gather", "scatter",
           "scatter_scaled", "cast_into", "cast_copy", "last_byte", "first_bad_index",
           "topk_indices", "count_at_least", "collect_at_least", "sample_keys", "select_among",
           "quantize_levels", "dequantize_levels", "count_bad_scales", "natural_encode",
           "natural_decode", "to_f16", "f16_to_f32", "to_bf16", "bf16_to_f32", "threshold_words",
           "threshold_parts", "threshold_decode", "random_subset", "compensated", "momentum",
           "source_sample", "source_topk", "subtract_at", "zero_at"]

compile_notice.install()  # a line on rank 0 while a first compile stalls a call


def float_work(x: np.ndarray) -> np.ndarray:
    """``x`` flat if float32/float64; a float32 copy of float16 ``x`` (kernels do no float16 math)."""
    return (x.astype(np.float32) if x.dtype == np.float16 else x).reshape(-1)


def pack_negative_bits(u: np.ndarray, shift: int, out: np.ndarray) -> int:
    """Bit ``i`` of ``out`` = ``x[i] < 0`` for the float words ``u`` (an unsigned view; bit
    ``shift`` is the sign); returns the number of non-finite elements."""
    absmask = u.dtype.type((1 << shift) - 1)
    return int(bits.pack_negative_bits(u, absmask, inf_word(_FLOAT_OF[u.dtype.itemsize]), shift, out))


def sign_stats(work: np.ndarray, packed: np.ndarray) -> tuple[float, float, int]:
    """(sum of the non-negative elements, sum of the negative ones, number of negative ones) of
    ``work``, whose negative bits are packed in ``packed`` (a popcount of those is the fastest
    count)."""
    pos, neg = quant.signed_sums(work)
    return pos, neg, int(np.bitwise_count(packed).sum())


def cast_into(src: np.ndarray, dst: np.ndarray) -> None:
    """``dst[...] = src`` with C casting (indices int64 -> uint32)."""
    dst[...] = src


def cast_copy(src: np.ndarray, dtype) -> np.ndarray:
    """A new array of ``dtype`` with ``src``'s values."""
    return src.astype(dtype)


def last_byte(a: np.ndarray) -> int:
    """The last element of the uint8 array ``a`` (0 when empty)."""
    return int(a[-1]) if a.size else 0


def topk_indices(u, absmask, k: int) -> np.ndarray:
    """Indices (ascending, int64) of the ``k`` largest magnitude keys, ties to the lowest index."""
    out = np.empty(k, dtype=np.int64)
    sparse.topk_indices(u, absmask, k, out)
    return out


def collect_at_least(u, absmask, thr, count: int | None = None) -> np.ndarray:
    """Indices (ascending, int64) of the keys ``>= thr``; ``count`` of them if already counted."""
    cand = np.empty(count_at_least(u, absmask, thr) if count is None else count, dtype=np.int64)
    sparse.collect_at_least(u, absmask, thr, cand)
    return cand


def sample_keys(u, absmask, m: int, stream) -> np.ndarray:
    """``m`` magnitude keys at random positions, sorted descending."""
    return sparse.sample_keys(u, absmask, m, stream)


def select_among(u, absmask, cand, k: int) -> np.ndarray:
    """The exact top-``k`` among the ascending candidate indices ``cand``."""
    idx = np.empty(k, dtype=np.int64)
    sparse.select_from_candidates(u, absmask, cand, k, idx)
    return idx


def quantize_levels(x, bucket: int, s: int, use_max: bool, stochastic: bool, seed_lo: int,
                    seed_hi: int, bits: int, scales: np.ndarray, out: np.ndarray) -> None:
    """Bucket scales into ``scales`` and packed level codes into ``out``
    (:func:`compress._kernels.quant.quantize_levels`); a scale that is not finite is stored as the
    canonical NaN, by an integer write (the device writes the same bits)."""
    quant.quantize_levels(x, bucket, s, use_max, stochastic, seed_lo, seed_hi, bits, scales, out)
    words, absmask = uint_view(scales)
    words[(words & absmask) >= inf_word(scales.dtype)] = nan_word(scales.dtype)


def count_bad_scales(scales: np.ndarray) -> int:
    """Number of scales that are negative or infinite (NaN marks a bucket that held a non-finite
    value: it decodes to NaN)."""
    return int(np.count_nonzero((scales < 0) | np.isinf(scales)))


def to_f16(flat: np.ndarray, half: np.ndarray) -> None:
    """Binary16 words ``half`` of the flat float array ``flat``: the processor's conversion for
    float32 (the integer-only kernel's words), NumPy's correctly rounded cast for float64, a copy
    for float16."""
    if flat.dtype == np.float32:
        floats.f32_to_f16_bits(flat, flat.view(np.uint32), half)
    else:
        half.view(np.float16)[:] = flat


def f16_to_f32(half: np.ndarray, out: np.ndarray) -> None:
    """Float32 values ``out`` of the binary16 words ``half`` (exact, NumPy's bits)."""
    floats.f16_to_f32_bits(half, out.view(np.uint32))


def to_bf16(f32: np.ndarray, words: np.ndarray) -> None:
    """Bfloat16 words of the flat float32 array ``f32`` (round to nearest even)."""
    floats.f32_to_bf16_bits(f32.view(np.uint32), words)


def bf16_to_f32(words: np.ndarray, f32: np.ndarray) -> None:
    """Float32 values ``f32`` of the bfloat16 words ``words`` (exact)."""
    floats.bf16_bits_to_f32(words, f32.view(np.uint32))


def threshold_words(idx: np.ndarray, u: np.ndarray, shift: int, words: np.ndarray) -> None:
    """Strom's words ``idx << 1 | sign`` of the elements ``idx`` of the unsigned view ``u``."""
    sign = (u[idx] >> shift).astype(np.uint32)
    words[:] = (idx.astype(np.uint32) << np.uint32(1)) | sign


def threshold_parts(words: np.ndarray, pair: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 indices, values) of validated threshold words; ``pair`` holds the bit patterns of
    ``+tau`` and ``-tau`` in the output dtype's unsigned view."""
    idx = (words >> np.uint32(1)).astype(np.int64)
    return idx, np.where(words & 1, pair[1], pair[0]).view(_FLOAT_OF[pair.dtype.itemsize])


def threshold_decode(words: np.ndarray, pair: np.ndarray, out: np.ndarray) -> None:
    """Scatter ``±tau`` of validated threshold words into the unsigned view ``out``."""
    idx, vals = threshold_parts(words, pair)
    scatter(vals.view(out.dtype), idx, out)


def random_subset(n: int, k: int, stream: int) -> np.ndarray:
    """``k`` distinct sorted int64 indices of ``range(n)`` drawn from ``stream`` (Floyd)."""
    idx = np.empty(k, dtype=np.int64)
    sparse.random_subset(n, k, np.uint64(stream), idx)
    return idx


_FLOAT_OF = {2: np.float16, 4: np.float32, 8: np.float64}


def compensated(x: np.ndarray, e: np.ndarray | None, out: np.ndarray) -> sources.Source:
    """Error feedback's ``x + e`` (``x`` when ``e`` is None), to be computed into ``out`` by the
    codec's selecting pass (:mod:`compress._kernels.sources`)."""
    return sources.Compensated(x, e, out)


def momentum(g, u, v, u_out, out, m: float) -> sources.Source:
    """DGC's ``u_out = u * m + g``, ``out = v + u_out``, to be computed by the codec's selecting
    pass."""
    return sources.Momentum(g, u, v, u_out, out, m)


def source_sample(src: sources.Source, m: int, stream) -> np.ndarray:
    """The keys :func:`sample_keys` would draw from the source's finished tensor, sorted
    descending."""
    return sources.sample_keys(src, m, stream)


def source_topk(src: sources.Source, k: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Indices (ascending, int64) of the source's ``k`` largest magnitude keys, and the bits of
    its values there (or None); runs it."""
    return sources.topk(src, k)


def subtract_at(values: np.ndarray, idx: np.ndarray, sent: np.ndarray) -> int:
    """``values[idx] -= sent`` (NumPy's result); return how many results are not finite."""
    if values.dtype == np.float16:
        with quiet():
            values[idx] -= sent
            return int(np.count_nonzero(~np.isfinite(values[idx])))
    return int(fused.subtract_at(values, idx, sent))


def zero_at(a: np.ndarray, idx: np.ndarray) -> None:
    """``a.flat[idx] = 0`` (``+0.0``) for a contiguous float array ``a``."""
    fused.zero_at(uint_view(a)[0], idx)
