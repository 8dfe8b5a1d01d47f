"""Reduction and validation device kernels (private).

Reductions are deterministic: each block reduces its share in shared memory in a fixed tree order and
writes one partial (or, for bucket scales, one result per bucket), so the same input on the same launch
shape always gives the same bits. Validation kernels report through a one-element array with an
atomic minimum (first bad position) or sum (number of bad items), which are exact.
"""

import math

from numba import cuda, float64, int64

from . import THREADS

__all__ = ["signed_sums", "bucket_scales", "first_bad_index", "count_bad_scales", "nan_where_nonfinite",
           "nan_max", "tree_reduce", "tree_sum"]


@cuda.jit(device=True)
def nan_max(a, b):
    """The larger of ``a`` and ``b``, NaN if either is NaN (a GPU max instruction drops a NaN)."""
    return a if (a >= b) | (a != a) else b


@cuda.jit(device=True)
def tree_reduce(buf, use_max):
    """Sum (or maximum, NaN if any entry is NaN) of the shared array ``buf`` (``THREADS`` entries)
    into ``buf[0]``, in a fixed order."""
    t = cuda.threadIdx.x
    half = THREADS // 2
    while half > 0:
        cuda.syncthreads()
        if t < half:
            buf[t] = nan_max(buf[t], buf[t + half]) if use_max else buf[t] + buf[t + half]
        half //= 2
    cuda.syncthreads()


@cuda.jit(device=True)
def tree_sum(buf):
    """:func:`tree_reduce` summing."""
    tree_reduce(buf, False)


@cuda.jit
def signed_sums(vals, partial):
    """Per block: the sum of ``max(x, 0)``, the sum of ``min(x, 0)`` (float64, with the host's NaN
    rule: a NaN reaches both) and the number of negative elements (``x < 0``: not ``-0.0``, not NaN),
    into ``partial[block, 0:3]``; the host adds the partials in block order."""
    pos = cuda.shared.array(THREADS, float64)
    neg = cuda.shared.array(THREADS, float64)
    cnt = cuda.shared.array(THREADS, float64)
    t = cuda.threadIdx.x
    p = 0.0
    q = 0.0
    c = 0.0
    for i in range(cuda.grid(1), vals.size, cuda.gridsize(1)):
        v = float64(vals[i])
        p += 0.0 if 0.0 > v else v  # the host's max(v, 0.0) and min(v, 0.0), spelled out: a GPU
        q += 0.0 if 0.0 < v else v  # max instruction would drop a NaN
        c += 1.0 if v < 0.0 else 0.0
    pos[t] = p
    neg[t] = q
    cnt[t] = c
    half = THREADS // 2
    while half > 0:  # tree_sum of the three arrays with one barrier per level
        cuda.syncthreads()
        if t < half:
            pos[t] += pos[t + half]
            neg[t] += neg[t + half]
            cnt[t] += cnt[t + half]
        half //= 2
    cuda.syncthreads()
    if t == 0:
        b = cuda.blockIdx.x
        partial[b, 0] = pos[0]
        partial[b, 1] = neg[0]
        partial[b, 2] = cnt[0]


@cuda.jit
def bucket_scales(x, bucket, use_max, scales):
    """``scales[b]`` = L2 norm (or max magnitude) of bucket ``b`` of ``x``, accumulated in float64;
    blocks loop over buckets."""
    acc = cuda.shared.array(THREADS, float64)
    t = cuda.threadIdx.x
    n = x.size
    for b in range(cuda.blockIdx.x, scales.size, cuda.gridDim.x):
        lo = b * bucket
        hi = min(lo + bucket, n)
        a = 0.0
        for i in range(lo + t, hi, THREADS):
            v = float64(x[i])
            a = nan_max(a, abs(v)) if use_max else a + v * v
        acc[t] = a
        tree_reduce(acc, use_max)
        if t == 0:
            scales[b] = acc[0] if use_max else math.sqrt(acc[0])
        cuda.syncthreads()


@cuda.jit
def first_bad_index(words, shift, n, result):
    """``result[0] = min(result[0], j)`` for every position ``j`` whose index ``words[j] >> shift`` is
    ``>= n`` or not strictly greater than the previous one (host: ``first_bad_index``)."""
    for j in range(cuda.grid(1), words.size, cuda.gridsize(1)):
        idx = int64(words[j] >> shift)
        bad = idx >= n
        if j > 0:
            bad = bad or idx <= int64(words[j - 1] >> shift)
        if bad:
            cuda.atomic.min(result, 0, j)


@cuda.jit
def count_bad_scales(scales, result):
    """``result[0] +=`` the number of scales that are negative or infinite (NaN is allowed)."""
    for j in range(cuda.grid(1), scales.size, cuda.gridsize(1)):
        v = float64(scales[j])
        if v < 0.0 or math.isinf(v):
            cuda.atomic.add(result, 0, 1)


@cuda.jit
def nan_where_nonfinite(words, absmask, inf, nan):
    """``words[j] = nan`` where the float whose bits are ``words[j]`` is not finite (an integer
    write: the canonical NaN's bits, as the host writes them)."""
    for j in range(cuda.grid(1), words.size, cuda.gridsize(1)):
        if (words[j] & absmask) >= inf:
            words[j] = nan
