"""Device procedures built from the kernels: what the codecs call (private).

Each function takes device arrays and, last, the :class:`compress._backends.cuda.Device` that owns
them, launches one or more kernels, and moves only small things to the host (reduction partials,
256-bin histograms, tile counts) where the next launch depends on them. The functions the codecs
call have the names and calling conventions of the host backend's (:mod:`compress._kernels.host`),
so each codec's encode and decode is written once (:mod:`compress._backends`).
"""

from __future__ import annotations

import numpy as np

from ..._util import inf_word, nan_word, uint_view
from . import MAX_BLOCKS, blocks
from . import bits as bits_kernels
from . import elementwise, quant, reduce, select

__all__ = ["float_work", "signed_sums", "sign_stats", "radix_select", "compact", "topk_indices",
           "count_at_least", "collect_at_least", "sample_keys", "select_among", "first_bad_index",
           "quantize_levels", "dequantize_levels", "count_bad_scales", "cast_copy", "cast_into",
           "last_byte", "pack_sign_bits", "pack_negative_bits", "unpack_two_values", "gather",
           "scatter", "scatter_scaled",
           "natural_encode", "natural_decode", "to_f16", "f16_to_f32", "to_bf16", "bf16_to_f32",
           "threshold_words", "threshold_parts", "threshold_decode"]



def float_work(x, dev):
    """``x`` (flat) if float32/float64; a float32 copy of float16 ``x`` (exact), as the host does."""
    x = x.reshape(-1)
    if x.dtype != np.float16:
        return x
    out = dev.empty(x.size, np.float32)
    dev.launch(elementwise.f16_to_f32, blocks(x.size), x.view(np.uint16), out.view(np.uint32))
    return out


def cast_copy(src, dtype, dev):
    """A new device array of ``dtype`` with ``src``'s values (integer casts, C semantics)."""
    out = dev.empty(src.size, dtype)
    cast_into(src, out, dev)
    return out


def last_byte(a, dev) -> int:
    """The last element of the uint8 device array ``a`` (0 when empty)."""
    return int(dev.to_host(a[a.size - 1:])[0]) if a.size else 0


def sign_stats(work, packed, dev) -> tuple[float, float, int]:
    """The host's ``sign_stats``: :func:`signed_sums` counts the set sign bits on the elements, which
    are the bits in ``packed``."""
    return signed_sums(work, dev)


def signed_sums(work, dev) -> tuple[float, float, int]:
    """(sum of the elements ``>= 0``, sum of those ``< 0``, number of negative ones) of float
    ``work``."""
    n = work.size
    nb = blocks(n)
    partial = dev.zeros((nb, 3), np.float64)
    if n:
        dev.launch(reduce.signed_sums, nb, work, partial)
    p = dev.to_host(partial)
    return float(p[:, 0].sum()), float(p[:, 1].sum()), int(p[:, 2].sum())


def radix_select(u, absmask, k: int, dev) -> tuple[int, int]:
    """``(v, greater)``: the k-th largest magnitude key of ``u`` (1 <= k <= n) and how many keys
    exceed it."""
    width = 8 * u.dtype.itemsize
    prefix = pmask = greater = 0
    remaining = k
    for shift in range(width - 8, -1, -8):
        hist = dev.zeros(256, np.int64)
        dev.launch(select.radix_histogram, blocks(u.size), u, np.uint64(absmask), np.uint64(prefix),
                   np.uint64(pmask), np.uint64(shift), hist)
        h = dev.to_host(hist)
        above = 0
        d = 255
        while above + int(h[d]) < remaining:
            above += int(h[d])
            d -= 1
        greater += above
        remaining -= above
        prefix |= d << shift
        pmask |= 0xFF << shift
    return prefix, greater


def _tile_counts(u, absmask, v, dev) -> np.ndarray:
    ntiles = -(-u.size // select.TILE)
    counts = dev.zeros((ntiles, 2), np.int64)
    dev.launch(select.tile_counts, min(ntiles, MAX_BLOCKS), u, np.uint64(absmask), np.uint64(v), counts)
    return dev.to_host(counts)


def compact(u, absmask, v: int, ties: int, dev):
    """int64 indices, ascending, of every key ``> v`` and of the first ``ties`` keys ``== v``."""
    if u.size == 0:
        return dev.empty(0, np.int64)
    c = _tile_counts(u, absmask, v, dev)
    total = int(c[:, 0].sum()) + min(int(c[:, 1].sum()), int(ties))
    offsets = np.zeros_like(c)
    np.cumsum(c[:-1], axis=0, out=offsets[1:])
    out = dev.empty(total, np.int64)
    if total:
        dev.launch(select.tile_write, min(c.shape[0], MAX_BLOCKS), u, np.uint64(absmask), np.uint64(v),
                   np.int64(ties), dev.to_device(offsets), out)
    return out


def topk_indices(u, absmask, k: int, dev):
    """Indices (ascending, int64) of the ``k`` largest magnitude keys, ties to the lowest index."""
    if k == 0:
        return dev.empty(0, np.int64)
    v, greater = radix_select(u, absmask, k, dev)
    return compact(u, absmask, v, k - greater, dev)


def count_at_least(u, absmask, thr: int, dev) -> int:
    """Number of keys ``>= thr``."""
    if u.size == 0:
        return 0
    c = _tile_counts(u, absmask, thr, dev)
    return int(c.sum())


def collect_at_least(u, absmask, thr: int, count: int | None = None, dev=None):
    """Indices (ascending, int64) of the keys ``>= thr`` (the tile counts count them; ``count`` is
    not needed here)."""
    return compact(u, absmask, thr, u.size, dev)


def sample_keys(u, absmask, m: int, stream: int, dev) -> np.ndarray:
    """The host's ``sample_keys``: ``m`` keys at random positions, sorted descending (on the host)."""
    keys = dev.empty(m, u.dtype)
    dev.launch(select.sample_keys, blocks(m), u, u.dtype.type(absmask), np.uint64(stream), keys)
    s = dev.to_host(keys)
    s.sort()
    return s[::-1].copy()


def select_among(u, absmask, cand, k: int, dev):
    """The host's ``select_from_candidates``: exact top-``k`` among the ascending indices ``cand``."""
    keys = dev.empty(cand.size, u.dtype)
    dev.launch(select.gather_keys, blocks(cand.size), u, u.dtype.type(absmask), cand, keys)
    full = (1 << (8 * u.dtype.itemsize)) - 1
    pos = topk_indices(keys, full, k, dev)
    out = dev.empty(k, np.int64)
    dev.launch(elementwise.gather, blocks(k), cand, pos, out)
    return out


def first_bad_index(words, shift: int, n: int, dev) -> int:
    """The host's ``first_bad_index``: first position whose index is out of range or out of order,
    -1 when all are valid."""
    if words.size == 0:
        return -1
    res = dev.to_device(np.array([words.size], dtype=np.int64))
    dev.launch(reduce.first_bad_index, blocks(words.size), words, words.dtype.type(shift), np.int64(n), res)
    bad = int(dev.to_host(res)[0])
    return -1 if bad == words.size else bad


def quantize_levels(x, bucket, s, use_max, stochastic, seed_lo, seed_hi, bits, scales, out, dev):
    """The host's ``quantize_levels``: bucket scales into ``scales``, packed codes into ``out``."""
    n = x.size
    if n == 0:
        return
    dev.launch(reduce.bucket_scales, min(scales.size, MAX_BLOCKS), x, np.int64(bucket), bool(use_max), scales)
    codes = out if bits == 8 else dev.empty(n, np.uint16)
    dev.launch(quant.level_codes, blocks(n), x, np.int64(bucket), np.int64(s), bool(stochastic),
               np.int64(seed_lo), np.int64(seed_hi), scales, codes)
    if bits != 8:
        dev.launch(bits_kernels.pack_codes, blocks(out.size), codes, np.int64(bits), out)
    words, absmask = uint_view(scales)
    dev.launch(reduce.nan_where_nonfinite, blocks(scales.size), words, absmask,
               inf_word(scales.dtype), nan_word(scales.dtype))


def dequantize_levels(packed, bits, s, bucket, scales, out, dev) -> int:
    """The host's ``dequantize_levels``; returns the number of codes above ``2 s``."""
    if out.size == 0:
        return 0
    bad = dev.zeros(1, np.int64)
    dev.launch(quant.dequantize_levels, blocks(out.size), packed, np.int64(bits), np.int64(s),
               np.int64(bucket), scales, out, bad)
    return int(dev.to_host(bad)[0])


def count_bad_scales(scales, dev) -> int:
    """Number of scales that are negative or infinite."""
    if scales.size == 0:
        return 0
    bad = dev.zeros(1, np.int64)
    dev.launch(reduce.count_bad_scales, blocks(scales.size), scales, bad)
    return int(dev.to_host(bad)[0])



def cast_into(src, dst, dev) -> None:
    """``dst[...] = src`` for flat arrays of equal size (integer casts, C semantics)."""
    if src.size:
        dev.launch(elementwise.gather_all, blocks(src.size), src, dst)


def pack_sign_bits(u, shift: int, out, dev) -> None:
    """Bit ``i`` of ``out`` (LSB-first) = bit ``shift`` of ``u[i]``."""
    if out.size:
        dev.launch(bits_kernels.pack_sign_bits, blocks(out.size), u, u.dtype.type(shift), out)


def pack_negative_bits(u, shift: int, out, dev) -> int:
    """The host's ``pack_negative_bits``: bit ``i`` of ``out`` = ``x[i] < 0`` for the float words
    ``u``; returns the number of non-finite elements."""
    if out.size == 0:
        return 0
    bad = dev.zeros(1, np.int64)
    dev.launch(bits_kernels.pack_negative_bits, blocks(out.size), u, u.dtype.type((1 << shift) - 1),
               inf_word(_FLOAT[u.dtype.itemsize]), u.dtype.type(shift), out, bad)
    return int(dev.to_host(bad)[0])


def unpack_two_values(packed, pos_value, neg_value, out, dev) -> None:
    """``out[i]`` = ``neg_value`` where bit ``i`` of ``packed`` is set, else ``pos_value``."""
    if out.size:
        dev.launch(elementwise.unpack_two_values, blocks(out.size), packed, pos_value, neg_value, out)


def gather(src, idx, out, dev) -> None:
    """``out[j] = src[idx[j]]`` (indices valid)."""
    if idx.size:
        dev.launch(elementwise.gather, blocks(idx.size), src, idx, out)


def scatter(vals, idx, out, dev) -> None:
    """``out[idx[j]] = vals[j]`` (indices validated)."""
    if idx.size:
        dev.launch(elementwise.scatter, blocks(idx.size), vals, idx, out)


def scatter_scaled(vals, idx, scale, out, dev) -> None:
    """``out[idx[j]] = vals[j] * scale`` (indices validated)."""
    if idx.size:
        dev.launch(elementwise.scatter_scaled, blocks(idx.size), vals, idx, scale, out)


def natural_encode(u, seed_lo: int, seed_hi: int, exps, dev) -> None:
    """Stochastically rounded 8-bit exponents of the float32 words ``u``."""
    if u.size:
        dev.launch(elementwise.natural_encode, blocks(u.size), u, np.int64(seed_lo), np.int64(seed_hi), exps)


def natural_decode(exps, signs, out, dev) -> None:
    """Float32 words ``out`` from exponents and packed sign bits."""
    if out.size:
        dev.launch(elementwise.natural_decode, blocks(out.size), exps, signs, out)


def to_f16(flat, half, dev) -> None:
    """The host's ``to_f16``: binary16 words of ``flat`` (a copy for float16 input)."""
    if flat.dtype == np.float16:
        dev.copy_into(half, flat.view(np.uint16))
    elif flat.size:
        mbits, bias, word = (23, 127, np.uint32) if flat.dtype == np.float32 else (52, 1023, np.uint64)
        dev.launch(elementwise.to_f16, blocks(flat.size), flat.view(word), mbits, bias, half)


def f16_to_f32(half, out, dev) -> None:
    """Float32 values ``out`` of binary16 words (exact)."""
    if half.size:
        dev.launch(elementwise.f16_to_f32, blocks(half.size), half, out.view(np.uint32))


def to_bf16(f32, words, dev) -> None:
    """Bfloat16 words of the flat float32 array ``f32``."""
    if f32.size:
        dev.launch(elementwise.to_bf16, blocks(f32.size), f32.view(np.uint32), words)


def bf16_to_f32(words, f32, dev) -> None:
    """Float32 values of bfloat16 words (exact)."""
    if words.size:
        dev.launch(elementwise.bf16_to_f32, blocks(words.size), words, f32.view(np.uint32))


def threshold_words(idx, u, shift: int, words, dev) -> None:
    """Strom's words ``idx << 1 | sign``."""
    if idx.size:
        dev.launch(elementwise.threshold_words, blocks(idx.size), idx, u, u.dtype.type(shift), words)


def threshold_parts(words, pair, dev):
    """(int64 indices, values) of validated threshold words; ``pair``: the bit patterns of ``+tau``
    and ``-tau`` in the output dtype's unsigned view."""
    idx = dev.empty(words.size, np.int64)
    vals = dev.empty(words.size, _FLOAT[pair.dtype.itemsize])
    if words.size:
        dev.launch(elementwise.threshold_parts, blocks(words.size), words, pair[0], pair[1], idx,
                   vals.view(pair.dtype))
    return idx, vals


def threshold_decode(words, pair, out, dev) -> None:
    """Scatter ``±tau`` of validated threshold words into the unsigned view ``out``."""
    if words.size:
        dev.launch(elementwise.threshold_decode, blocks(words.size), words, pair[0], pair[1], out)


_FLOAT = {2: np.float16, 4: np.float32, 8: np.float64}
