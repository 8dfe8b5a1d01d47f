"""Numba kernels of the compressed strategies: merging sorted (index, value) lists, and adding
p of them into one dense sum in rank order.

Kept apart from the Python API (which validates its inputs first); they take only arrays and
scalars, with njit options from one constant.
"""

from __future__ import annotations

import numpy as np
from compress import compile_notice
from compress.stream import BLOCK, store_fence, stream_block
from numba import njit, types
from numba.extending import overload

__all__ = ["NJIT", "CHUNK", "merge_sum", "add_sparse_into_dense", "sum_in_rank_order"]

NJIT = dict(cache=True, nogil=True)

compile_notice.install()  # a line on rank 0 while a first compile stalls a call


@njit(**NJIT)
def merge_sum(ia, va, ib, vb, io, vo):  # pragma: no cover - compiled
    """Merge two strictly increasing index lists, adding values where they meet.

    ``(ia, va)`` holds the lower ranks' contributions and is added first. Writes the union to
    ``io``/``vo`` (each at least ``len(ia) + len(ib)`` long) and returns its length.
    """
    i = j = k = 0
    na, nb = ia.size, ib.size
    while i < na and j < nb:
        if ia[i] < ib[j]:
            io[k] = ia[i]
            vo[k] = va[i]
            i += 1
        elif ib[j] < ia[i]:
            io[k] = ib[j]
            vo[k] = vb[j]
            j += 1
        else:
            io[k] = ia[i]
            vo[k] = va[i] + vb[j]
            i += 1
            j += 1
        k += 1
    while i < na:
        io[k] = ia[i]
        vo[k] = va[i]
        i += 1
        k += 1
    while j < nb:
        io[k] = ib[j]
        vo[k] = vb[j]
        j += 1
        k += 1
    return k


@njit(**NJIT)
def add_sparse_into_dense(dense, idx, vals, sparse_first):  # pragma: no cover - compiled
    """``dense[idx] += vals`` with operands in rank order (``sparse_first``: sparse is lower)."""
    for t in range(idx.size):
        if sparse_first:
            dense[idx[t]] = vals[t] + dense[idx[t]]
        else:
            dense[idx[t]] = dense[idx[t]] + vals[t]


#: Elements of the dense result summed at a time: the chunk (32 KiB of float32) stays in L1
#: or L2 while every rank's entries in it are added and it is divided; a whole number of
#: streamed blocks. Larger chunks mean fewer exits from the per-rank loops (a mispredicted
#: branch each).
CHUNK = 8192


def _special(v):  # pragma: no cover - replaced by the overload below inside kernels
    """Whether ``v + 0.0`` is not ``v`` bit for bit: ``-0.0`` (the sum is ``+0.0``) and a
    signalling NaN (the sum is quiet)."""
    raise NotImplementedError


def _quiet(v):  # pragma: no cover - replaced by the overload below inside kernels
    """The NaN ``v`` quiet, as the hardware's arithmetic returns it (payload kept, quiet bit
    set), written with integers: the compiler may pass a NaN operand through unchanged."""
    raise NotImplementedError


_FORMATS = {types.float32: (np.float32, np.uint32, 0x80000000, 0x7F800000, 0x00400000),
            types.float64: (np.float64, np.uint64, 0x8000000000000000, 0x7FF0000000000000,
                            0x0008000000000000)}


@overload(_special)
def _special_overload(v):
    if v not in _FORMATS:
        return None
    ftype, utype, sign, expo, quiet = (_FORMATS[v][0], _FORMATS[v][1], *(
        _FORMATS[v][1](c) for c in _FORMATS[v][2:]))

    def special(v):
        b = ftype(v).view(utype)
        return b == sign or ((b & expo) == expo and (b & (expo | quiet)) == expo
                             and (b & ~(sign | expo)) != 0)
    return special


@overload(_quiet)
def _quiet_overload(v):
    if v not in _FORMATS:
        return None
    ftype, utype, quiet = _FORMATS[v][0], _FORMATS[v][1], _FORMATS[v][1](_FORMATS[v][4])
    return lambda v: utype(ftype(v).view(utype) | quiet).view(ftype)


@njit(**NJIT)
def _add(a, b):  # pragma: no cover - compiled
    """``a + b`` as NumPy's element-wise add gives it on this hardware: a NaN operand comes out
    quiet, the first one when both are NaN (the compiler may swap the operands of ``+``)."""
    s = a + b
    if s == s:
        return s
    if a != a:
        return _quiet(a)
    return _quiet(b) if b != b else s  # inf - inf: the hardware's default NaN


@njit(**NJIT)
def _plus_zero(a, zero):  # pragma: no cover - compiled
    """``a + 0.0`` as NumPy gives it: ``-0.0`` becomes ``+0.0``, a NaN comes out quiet."""
    if a != a:
        return _quiet(a)
    return zero if a == 0 else a


@njit(**NJIT)
def sum_in_rank_order(out, idx, vals, offsets, divisor, average, head,
                      stream):  # pragma: no cover - compiled
    """The dense sum of ``p`` sparse contributions into ``out``, bit for bit what NumPy gives
    for ``acc = d_0.copy(); acc += d_1; ...; acc += d_{p-1}`` (then ``acc /= divisor`` when
    ``average``), with ``d_r`` zero but at its indices.

    Contribution ``r`` is ``idx[offsets[r]:offsets[r + 1]]`` (strictly increasing, any integer
    type) and the values there (in ``out``'s dtype). The sum is built a chunk of :data:`CHUNK`
    elements at a time in a buffer that stays in the caches: zeroed, given rank 0's values, every later
    rank's added in rank order, divided, then written to ``out`` once (streamed past the caches
    when ``stream``: ``out`` is then 64-byte aligned at element ``head``, where the chunks
    start; the ``head`` elements before are a chunk of their own). So ``out`` costs one write,
    no read. Where a rank sends nothing NumPy adds ``+0.0``, which changes only ``-0.0`` (to
    ``+0.0``) and a signalling NaN (to a quiet one): such elements of a chunk (all from rank
    0's values; no sum but ``-0.0 + -0.0`` makes one) are listed and get that addition from
    each rank that skips them.
    """
    p = offsets.size - 1
    n = out.size
    zero = out.dtype.type(0)
    inverse = out.dtype.type(1) / divisor
    # x / 2^m and x * 2^-m are the same rounding of the same quotient: multiply (cheaper) then
    exact = inverse * divisor == 1 and (np.int64(divisor) & (np.int64(divisor) - 1)) == 0
    heads = offsets[:p].copy()
    special = np.empty(CHUNK, dtype=np.int64)
    buf = np.empty(CHUNK, dtype=out.dtype)
    head = min(head, n)
    lo = 0
    while lo < n:
        hi = min(n, head if 0 < head and lo == 0 else lo + CHUNK)
        m = hi - lo
        for i in range(CHUNK):  # whole: a constant trip count is SIMD code
            buf[i] = zero
        ns = 0
        t = heads[0]
        while t < offsets[1] and idx[t] < hi:
            i = idx[t] - lo
            buf[i] = vals[t]
            if _special(vals[t]):
                special[ns] = i
                ns += 1
            t += 1
        heads[0] = t
        for r in range(1, p):
            first = heads[r]
            t = first
            end = offsets[r + 1]
            while t < end and idx[t] < hi:
                i = idx[t] - lo
                buf[i] = _add(buf[i], vals[t])
                t += 1
            heads[r] = t
            if ns:  # the listed elements this rank skips get NumPy's + 0.0
                j = first
                keep = 0
                for s in range(ns):
                    i = special[s]
                    while j < t and idx[j] - lo < i:
                        j += 1
                    if j == t or idx[j] - lo != i:
                        buf[i] = _plus_zero(buf[i], zero)
                    if _special(buf[i]):
                        special[keep] = i
                        keep += 1
                ns = keep
        if average and exact:
            for i in range(CHUNK):
                buf[i] = buf[i] * inverse
        elif average:
            for i in range(CHUNK):
                buf[i] = buf[i] / divisor
        if stream and m == CHUNK:
            for b in range(0, CHUNK, BLOCK):
                stream_block(buf[b:], out, lo + b)
        else:
            dst = out[lo:hi]  # a view: its indices are known >= 0, so the copy is SIMD code
            for i in range(m):
                dst[i] = buf[i]
        lo = hi
    if stream:
        store_fence()
