"""Sparse selection, gather and scatter kernels (private).

All selection kernels work on *magnitude keys*: the IEEE bit pattern of ``|x|`` read as an unsigned
integer (``bits & absmask``). For non-negative floats integer order equals numeric order, NaN keys sort
above infinity, and comparisons never see a NaN, so selection needs no float special cases and works
unchanged for float16, float32 and float64 (through uint16/uint32/uint64 views).

``topk_indices`` finds the exact k largest keys in three steps: (1) estimate a threshold from a strided
sample so that about ``2k`` elements pass it; (2) one pass over the data that skips blocks of 64 whose
maximum key is below the threshold and records the indices of passing elements; (3) a radix select
on the few candidate keys (:func:`kth_largest`) gives the k-th largest key ``v``; the output takes
every key ``> v`` and the first (lowest-index) keys ``== v`` until there are k. When the estimate
fails (too few or too many candidates) it falls back to the same selection over all n keys, so the
result is always exact.

Why a radix select of our own rather than ``np.partition``: Numba's ``np.partition`` compiles
``valid_kths``, ``np.unique`` and a quicksort with it, most of a process's cold first top-k
(docs/benchmarks/first-call.md); the radix select is a few loops. It reads the keys once per byte of
the key (2, 4 or 8 passes), each pass only counting; ``np.partition`` reads them about twice.
Both give the same ``v``: the k-th largest key is one value, whatever finds it.
"""

import numpy as np
from numba import njit

from . import NJIT
from .rng import uniform_below

__all__ = [
    "topk_indices",
    "kth_largest",
    "select_from_candidates",
    "count_at_least",
    "collect_at_least",
    "sample_keys",
    "random_subset",
    "first_bad_index",
    "gather",
    "scatter",
    "scatter_scaled",
]

_BLOCK = 64
_SAMPLE = 65536


@njit(**NJIT)
def count_at_least(bits, absmask, thr):
    """Number of elements whose magnitude key is ``>= thr``."""
    c = 0
    for i in range(bits.size):
        c += (bits[i] & absmask) >= thr
    return c


@njit(**NJIT)
def collect_at_least(bits, absmask, thr, out):
    """Write indices of keys ``>= thr`` into ``out`` (ascending); return how many there are.

    Stops writing (but keeps counting) once ``out`` is full, so a return value larger than
    ``out.size`` means the list is incomplete.
    """
    n = bits.size
    cap = out.size
    cnt = 0
    nblocks = n // _BLOCK
    for blk in range(nblocks):
        base = blk * _BLOCK
        m = bits.dtype.type(0)
        for t in range(_BLOCK):
            m = max(m, bits[base + t] & absmask)
        if m >= thr:
            for t in range(_BLOCK):
                if (bits[base + t] & absmask) >= thr:
                    if cnt < cap:
                        out[cnt] = base + t
                    cnt += 1
    for i in range(nblocks * _BLOCK, n):
        if (bits[i] & absmask) >= thr:
            if cnt < cap:
                out[cnt] = i
            cnt += 1
    return cnt


@njit(**NJIT)
def kth_largest(keys, k):
    """The ``k``-th largest of the unsigned integer ``keys`` (``1 <= k <= keys.size``; ``k = 1``:
    the largest), by radix select from the most significant byte: each pass counts the keys
    that match the bytes fixed so far by their next byte, and fixes the byte whose bucket holds
    the k-th largest among them. The arithmetic is in uint64 (Numba would mix uint64 with int64
    into floats)."""
    byte = np.uint64(0xFF)
    prefix = np.uint64(0)
    fixed = np.uint64(0)  # the mask of the bytes fixed so far
    left = np.int64(k)
    hist = np.empty(256, dtype=np.int64)
    shift = keys.itemsize * 8
    while shift > 0:
        shift -= 8
        s = np.uint64(shift)
        hist[:] = 0
        for i in range(keys.size):
            key = np.uint64(keys[i])
            if key & fixed == prefix:
                hist[np.int64((key >> s) & byte)] += 1
        b = 255
        while hist[b] < left:
            left -= hist[b]
            b -= 1
        prefix |= np.uint64(b) << s
        fixed |= byte << s
    return keys.dtype.type(prefix)


@njit(**NJIT)
def select_from_candidates(bits, absmask, cand, k, out):
    """Exact top-``k`` keys among the indices ``cand`` (ascending), ties to the lowest index."""
    keys = np.empty(cand.size, dtype=bits.dtype)
    for j in range(cand.size):
        keys[j] = bits[cand[j]] & absmask
    v = kth_largest(keys, k)
    above = 0
    for j in range(cand.size):
        above += keys[j] > v
    ties = k - above
    o = 0
    for j in range(cand.size):
        kj = keys[j]
        if kj > v or (kj == v and ties > 0):
            if kj == v:
                ties -= 1
            out[o] = cand[j]
            o += 1


@njit(**NJIT)
def topk_indices(bits, absmask, k, out):
    """Indices (ascending) of the ``k`` largest magnitude keys of ``bits`` into ``out[:k]``."""
    n = bits.size
    if k == 0:
        return
    if k == n:
        for i in range(n):
            out[i] = i
        return
    if n > 4 * _SAMPLE:
        stride = n // _SAMPLE
        sample = np.empty(_SAMPLE, dtype=bits.dtype)
        for j in range(_SAMPLE):
            sample[j] = bits[j * stride] & absmask
        want = 2.0 * k + 3.0 * np.sqrt(k) + 64.0  # expected candidates, with a safety margin
        pos = _SAMPLE - np.int64(np.ceil(want * _SAMPLE / n))
        if pos > 0:
            thr = kth_largest(sample, _SAMPLE - pos)  # np.partition(sample, pos)[pos]
            cap = 4 * k + 1024
            cand = np.empty(cap, dtype=np.int64)
            cnt = collect_at_least(bits, absmask, thr, cand)
            if k <= cnt <= cap:
                select_from_candidates(bits, absmask, cand[:cnt], k, out)
                return
    select_from_candidates(bits, absmask, np.arange(n), k, out)


@njit(**NJIT)
def sample_keys(bits, absmask, m, stream):
    """``m`` magnitude keys at random positions (with replacement), sorted descending."""
    n = bits.size
    s = np.empty(m, dtype=bits.dtype)
    for j in range(m):
        s[j] = bits[uniform_below(stream, j, n)] & absmask
    s.sort()
    return s[::-1].copy()


@njit(**NJIT)
def random_subset(n, k, stream, out):
    """``k`` distinct indices of ``range(n)``, uniform over k-subsets, sorted ascending (Floyd 1987).

    For ``j`` from ``n - k`` to ``n - 1``: draw ``t`` uniform in ``[0, j]``; insert ``t`` unless it is
    already present, else insert ``j``. A power-of-two open-addressing table holds the set.
    """
    size = 1
    while size < 2 * k:
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    mask = size - 1
    o = 0
    for j in range(n - k, n):
        t = uniform_below(stream, j, j + 1)
        for cand in (t, np.int64(j)):
            h = (cand * 0x9E3779B1) & mask
            found = False
            while table[h] != -1:
                if table[h] == cand:
                    found = True
                    break
                h = (h + 1) & mask
            if not found:
                table[h] = cand
                out[o] = cand
                o += 1
                break
    out[:k].sort()


@njit(**NJIT)
def first_bad_index(words, shift, n):
    """Position of the first word whose index ``words[i] >> shift`` is ``>= n`` or not strictly
    greater than the previous one; ``-1`` when all are valid.

    A valid list is checked by one branch-free pass (SIMD code: every payload a rank receives
    goes through it); only a bad one is searched for its first bad word."""
    if words.size == 0:
        return -1
    s = words.dtype.type(shift)
    ok = np.int64(words[words.size - 1] >> s) < n  # increasing: the last is the largest
    for i in range(1, words.size):
        ok &= (words[i] >> s) > (words[i - 1] >> s)
    if ok:
        return -1
    prev = -1
    for i in range(words.size):
        idx = np.int64(words[i] >> shift)
        if idx >= n or idx <= prev:
            return i
        prev = idx
    return -1


@njit(**NJIT)
def gather(src, idx, out):
    """``out[j] = src[idx[j]]`` (indices must be valid)."""
    for j in range(idx.size):
        out[j] = src[idx[j]]


@njit(**NJIT)
def scatter(vals, idx, out):
    """``out[idx[j]] = vals[j]`` (indices must be validated by the caller)."""
    for j in range(idx.size):
        out[idx[j]] = vals[j]


@njit(**NJIT)
def scatter_scaled(vals, idx, scale, out):
    """``out[idx[j]] = vals[j] * scale`` (indices must be validated by the caller)."""
    for j in range(idx.size):
        out[idx[j]] = vals[j] * scale
