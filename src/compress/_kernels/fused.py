"""Fused compensation and selection kernels: one pass that writes what a memory compresses and
gathers what the codec's selection needs (private).

A memory around a sparsifying codec compresses a tensor it computes first: error feedback
``c = x + e``; DGC's momentum correction ``u' = u m + g``, ``c = v + u'``. Computing ``c`` in one
pass and selecting in another reads it twice, and allocating it afresh every step pays a page
fault per 4 KiB. These kernels compute ``c`` into a buffer the memory keeps (its new residual),
in blocks of 64 elements, and gather the selection's statistics on the way:

* how many elements of ``c`` are inf or NaN (``not |c| < inf``);
* how many reach the threshold ``thr`` (``not |c| < thr``), and their indices (ascending) and
  bits, the first ``cand.size - 1`` of them.

The block loop tests magnitudes as floats, which the compiler turns into SIMD code (a magnitude
*key*, the bits of ``|c|`` as an unsigned integer as in :mod:`.sparse`, made the loop scalar), and
sets bit ``t`` of a 64-bit mask when the block's element ``t`` reaches ``thr``; the elements to
collect are then the mask's set bits, found by counting trailing zeros: no second look at the
block's elements, and no branch per element (the first two set bits are taken without asking
how many there are). For a threshold given as a key ``t``, ``not |c| < float(t)`` is
``key >= t`` exactly: float order is key order for non-NaN magnitudes, and a NaN (whose key is
above every finite key) passes. The collected bits let the selection run without reading ``c``
again at random places. A block is computed into a 64-element buffer that stays in L1 and
written to ``c`` from there, past the caches when ``c`` is large (:mod:`compress.stream`: no read of
``c``'s lines before they are written).

``c`` gets the bits NumPy's ``x + e`` (and ``u * m + g``, ``v + u'``) give: IEEE operations in
the same order, no contraction into fused multiply-adds (``fastmath`` is off). (Which NaN comes
out of two NaN operands is the compiler's choice; a memory's state holds no NaN.) Float16 has no
arithmetic here (Numba does none): its memories let NumPy compute ``c``, and :func:`scan` scans
it by keys.
"""

import numpy as np
from numba import njit, types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import overload

from . import NJIT
from .rng import uniform_below
from ..stream import BLOCK, store_fence, stream_block

__all__ = ["compensate_scan", "momentum_scan", "scan", "compensate_at", "momentum_at",
           "select_collected", "subtract_at", "zero_at", "random_positions"]



def _bits(v):  # pragma: no cover - replaced by the overload below inside kernels
    """The bits of the float ``v`` as an unsigned integer."""
    raise NotImplementedError


@overload(_bits)
def _bits_overload(v):
    if v == types.float32:
        return lambda v: np.float32(v).view(np.uint32)
    if v == types.float64:
        return lambda v: np.float64(v).view(np.uint64)
    return None


@njit(**NJIT, inline="always")
def _take(v, i, thr, cand, bits, cnt):  # pragma: no cover - compiled
    """Collect element ``i`` (value ``v``) when it reaches ``thr``; return the new count."""
    if not abs(v) < thr:
        j = min(cnt, cand.size - 1)
        cand[j] = i
        bits[j] = _bits(v)
        cnt += 1
    return cnt


@njit(**NJIT, inline="always")
def _collect(blk, lo, hits, cand, bits, cnt, nonfinite):  # pragma: no cover - compiled
    """Collect the block's elements set in ``hits`` (index ``lo + t``, bits of ``blk[t]``) after
    the ``cnt`` collected so far (stores past ``cand.size - 1`` go to the last slot); return the
    new count and ``nonfinite`` plus the inf and NaN among them (every one reaches a threshold:
    none is ``< thr``)."""
    cap = cand.size - 1
    inf = blk.dtype.type(np.inf)
    for _ in range(2):  # most blocks hold at most two: taken without a branch on their number
        t = np.int64(trailing_zeros(hits)) & (BLOCK - 1)  # no hit: 64, read as 0, not counted
        got = hits != 0
        j = min(cnt, cap)
        cand[j] = lo + t
        bits[j] = _bits(blk[t])
        nonfinite += got & (not abs(blk[t]) < inf)
        cnt += got
        hits &= hits - np.uint64(got)
    while hits:
        t = np.int64(trailing_zeros(hits))
        j = min(cnt, cap)
        cand[j] = lo + t
        bits[j] = _bits(blk[t])
        nonfinite += not abs(blk[t]) < inf
        cnt += 1
        hits &= hits - np.uint64(1)
    return cnt, nonfinite


@njit(**NJIT, inline="always")
def _store(blk, dst, lo, stream):  # pragma: no cover - compiled
    """``dst[lo:lo + BLOCK] = blk``: streamed past the caches when ``stream``."""
    if stream:
        stream_block(blk, dst, lo)
    else:
        for t in range(BLOCK):
            dst[lo + t] = blk[t]


@njit(**NJIT)
def compensate_scan(x, e, c, thr, cand, bits, head, stream):  # pragma: no cover - compiled
    """``c = x + e`` (float32 or float64, all of one size); return ``(nonfinite, count)``: how
    many elements of ``c`` are inf or NaN, and how many reach ``thr`` (``not |c| < thr``: NaN
    does), whose indices and bits go to ``cand`` and ``bits`` while they have room (the first
    ``cand.size - 1``; the last slot takes the stores past that: no branch on a full buffer).

    From element ``head`` on, ``c`` is written in blocks of :data:`BLOCK`, streamed when
    ``stream`` (``c`` is then 64-byte aligned at ``head``); the elements before and the tail
    one by one."""
    n = x.size
    inf = c.dtype.type(np.inf)
    head = min(head, n)
    nonfinite = 0
    cnt = 0
    for i in range(head):
        v = x[i] + e[i]
        c[i] = v
        nonfinite += not abs(v) < inf
        cnt = _take(v, i, thr, cand, bits, cnt)
    # views from head: indices known to be >= 0, so the block loop is SIMD code
    xs, es, cs = x[head:], e[head:], c[head:]
    blk = np.empty(BLOCK, dtype=c.dtype)
    nb = xs.size // BLOCK
    for b in range(nb):
        lo = b * BLOCK
        hits = np.uint64(0)
        for t in range(BLOCK):
            v = xs[lo + t] + es[lo + t]
            blk[t] = v
            hits |= np.uint64(not abs(v) < thr) << np.uint64(t)
        _store(blk, cs, lo, stream)
        cnt, nonfinite = _collect(blk, head + lo, hits, cand, bits, cnt, nonfinite)
    for i in range(head + nb * BLOCK, n):
        v = x[i] + e[i]
        c[i] = v
        nonfinite += not abs(v) < inf
        cnt = _take(v, i, thr, cand, bits, cnt)
    if stream:
        store_fence()
    return nonfinite, cnt


@njit(**NJIT)
def momentum_scan(g, u, v, u_out, c, momentum, thr, cand, bits, head,
                  stream):  # pragma: no cover - compiled
    """DGC's momentum correction ``u_out = u * momentum + g``, ``c = v + u_out`` (float32 or
    float64; ``momentum`` of that type); return ``(nonfinite, count)`` of ``c`` as
    :func:`compensate_scan` does, writing ``c`` as it does (``u_out`` with plain stores)."""
    n = g.size
    inf = c.dtype.type(np.inf)
    head = min(head, n)
    nonfinite = 0
    cnt = 0
    for i in range(head):
        w = u[i] * momentum + g[i]
        u_out[i] = w
        w = v[i] + w
        c[i] = w
        nonfinite += not abs(w) < inf
        cnt = _take(w, i, thr, cand, bits, cnt)
    gs, us, vs, uos, cs = g[head:], u[head:], v[head:], u_out[head:], c[head:]
    ub = np.empty(BLOCK, dtype=c.dtype)
    blk = np.empty(BLOCK, dtype=c.dtype)
    nb = gs.size // BLOCK
    for b in range(nb):
        lo = b * BLOCK
        hits = np.uint64(0)
        for t in range(BLOCK):
            w = us[lo + t] * momentum + gs[lo + t]
            ub[t] = w
            w = vs[lo + t] + w
            blk[t] = w
            hits |= np.uint64(not abs(w) < thr) << np.uint64(t)
        _store(ub, uos, lo, False)  # one streamed output: two interleaved streams stall
        _store(blk, cs, lo, stream)
        cnt, nonfinite = _collect(blk, head + lo, hits, cand, bits, cnt, nonfinite)
    for i in range(head + nb * BLOCK, n):
        w = u[i] * momentum + g[i]
        u_out[i] = w
        w = v[i] + w
        c[i] = w
        nonfinite += not abs(w) < inf
        cnt = _take(w, i, thr, cand, bits, cnt)
    if stream:
        store_fence()
    return nonfinite, cnt


@njit(**NJIT)
def scan(words, absmask, inf, thr, cand, bits):
    """:func:`compensate_scan`'s statistics of a tensor already computed, on its unsigned view
    ``words`` (float16 words, or any float's) and magnitude keys: ``inf`` the key of ``+inf``,
    ``thr`` the threshold's key."""
    n = words.size
    nonfinite = 0
    cnt = 0
    cap = cand.size - 1
    for blk in range(n // BLOCK + 1):
        lo = blk * BLOCK
        hi = min(n, lo + BLOCK)
        hit = 0
        for i in range(lo, hi):
            key = words[i] & absmask
            nonfinite += key >= inf
            hit += key >= thr
        if hit:
            for i in range(lo, hi):
                if (words[i] & absmask) >= thr:
                    j = min(cnt, cap)
                    cand[j] = i
                    bits[j] = words[i]
                    cnt += 1
    return nonfinite, cnt


@njit(**NJIT)
def compensate_at(x, e, pos, absmask, keys):
    """``keys[j]``: the magnitude key of ``x + e`` at ``pos[j]`` (a sample, before the pass; one
    loop, so the scattered loads overlap)."""
    for j in range(pos.size):
        p = pos[j]
        keys[j] = _bits(x[p] + e[p]) & absmask


@njit(**NJIT)
def momentum_at(g, u, v, momentum, pos, absmask, keys):
    """``keys[j]``: the magnitude key of ``v + (u * momentum + g)`` at ``pos[j]``."""
    for j in range(pos.size):
        p = pos[j]
        keys[j] = _bits(v[p] + (u[p] * momentum + g[p])) & absmask


@njit(**NJIT)
def random_positions(n, m, stream, out):
    """The ``m`` positions :func:`.sparse.sample_keys` reads (uniform in ``[0, n)``, with
    replacement, from ``stream``), so a memory can compute its tensor there before the pass."""
    for j in range(m):
        out[j] = uniform_below(stream, j, n)


@njit(**NJIT)
def select_collected(cand, bits, absmask, v, k, out_idx, out_bits):
    """The exact top-``k`` among collected candidates (ascending indices ``cand`` and the bits
    of their values, ``bits``) whose ``k``-th largest magnitude key is ``v``, ties to the lowest
    index, as :func:`.sparse.select_from_candidates` selects them: indices into ``out_idx``, bits
    into ``out_bits`` (``k + 1`` long: the last slot takes a store that is not kept). The
    candidates' bits came with them: nothing is read from the tensor."""
    above = 0
    for j in range(cand.size):
        above += (bits[j] & absmask) > v
    ties = k - above
    o = 0
    for j in range(cand.size):  # without branches: a store to slot o is kept when o advances
        key = bits[j] & absmask
        take = (key > v) | ((key == v) & (ties > 0))
        ties -= (key == v) & take
        out_idx[o] = cand[j]
        out_bits[o] = bits[j]
        o += take


@njit(**NJIT)
def subtract_at(c, idx, sent):
    """``c[idx[j]] -= sent[j]`` (float32 or float64); return how many results are not finite."""
    bad = 0
    for j in range(idx.size):
        r = c[idx[j]] - sent[j]
        c[idx[j]] = r
        bad += not np.isfinite(r)
    return bad


@njit(**NJIT)
def zero_at(words, idx):
    """``words[idx[j]] = 0`` (an unsigned view: ``+0.0`` in any float format)."""
    for j in range(idx.size):
        words[idx[j]] = 0

