"""Slow, obviously-correct NumPy references for every codec (decoded result of one encode).

Each ``ref_<codec>(x, params)`` returns what ``decode(encode(x))`` must be, given the header
parameters of the payload that the fast path produced (random streams, scales). Stochastic codecs
use the same counter-based hash as the kernels, written with NumPy integer arrays, so the comparison
is bit for bit; bucket scales come from the payload and are compared separately with ``ref_scales``.
"""

from __future__ import annotations

import math

import numpy as np

M32 = np.uint64(0xFFFFFFFF)
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def lowbias32(x):
    x = x.astype(np.uint64) & M32
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & M32
    x ^= x >> np.uint64(16)
    return x


def uniform24(n, stream):
    lo, hi = np.uint64(stream & 0xFFFFFFFF), np.uint64(stream >> 32)
    i = np.arange(n, dtype=np.uint64)
    high = (i >> np.uint64(32)) * np.uint64(0x9E3779B9)
    return lowbias32((lowbias32((i & M32) ^ lo) + hi + high) & M32) >> np.uint64(8)


def sign_bits(x):
    u = x.reshape(-1).view(UINT[x.dtype.itemsize])
    return (u >> (8 * x.dtype.itemsize - 1)).astype(bool)


def magnitude_keys(x):
    u = x.reshape(-1).view(UINT[x.dtype.itemsize])
    return u & u.dtype.type((1 << (8 * x.dtype.itemsize - 1)) - 1)


def k_for(n, ratio):
    return 0 if n == 0 else min(n, max(1, math.ceil(ratio * n - 1e-9)))


def ref_none(x, p):
    return x.copy()


def ref_fp16(x, p):
    return x.astype(np.float16).astype(x.dtype)


def ref_bf16(x, p):
    u = x.astype(np.float32).reshape(-1).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    nan = np.isnan(x.astype(np.float32).reshape(-1))
    bits = np.where(nan, (u >> np.uint64(16)) | np.uint64(0x40), rounded).astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32).astype(x.dtype).reshape(x.shape)


def ref_topk_indices(x, k):
    order = np.argsort(-magnitude_keys(x).astype(np.float64), kind="stable")
    return np.sort(order[:k])


def _sparse(x, idx, scale=1.0):
    out = np.zeros(x.size, dtype=x.dtype)
    out[idx] = x.reshape(-1)[idx] * x.dtype.type(scale) if scale != 1.0 else x.reshape(-1)[idx]
    return out.reshape(x.shape)


def ref_topk(x, p):
    return _sparse(x, ref_topk_indices(x, p["nnz"]))


def ref_threshold(x, p):
    tau = p["tau"]
    keep = np.abs(x.reshape(-1)) >= x.dtype.type(tau)
    out = np.where(keep, np.where(sign_bits(x), -tau, tau), 0.0).astype(x.dtype)
    return out.reshape(x.shape)


def negative(x):
    """The sign codecs' bit: ``x < 0`` by value (-0.0 and NaN are not negative)."""
    return x.reshape(-1).astype(np.float64) < 0


def ref_signsgd(x, p):
    if not np.isfinite(x).all():
        return np.full(x.shape, np.nan, x.dtype)
    return np.where(negative(x), -1.0, 1.0).astype(x.dtype).reshape(x.shape)


def ref_efsignsgd(x, p):
    scale = np.abs(x.astype(np.float64)).mean() if x.size else 0.0
    assert math.isclose(scale, p["scale"], rel_tol=1e-9, abs_tol=1e-300)
    return np.where(negative(x), -p["scale"], p["scale"]).astype(x.dtype).reshape(x.shape)


def ref_onebit(x, p):
    neg = negative(x)
    v = x.reshape(-1).astype(np.float64)
    pos_mean = v[~neg].mean() if (~neg).any() else 0.0
    neg_mean = v[neg].mean() if neg.any() else 0.0
    assert math.isclose(pos_mean, p["pos"], rel_tol=1e-9) and math.isclose(neg_mean, p["neg"], rel_tol=1e-9)
    return np.where(neg, p["neg"], p["pos"]).astype(x.dtype).reshape(x.shape)


def ref_scales(x, bucket, use_max):
    v = x.reshape(-1).astype(np.float64)
    out = []
    for lo in range(0, v.size, bucket):
        b = v[lo : lo + bucket]
        out.append(np.abs(b).max() if use_max else np.sqrt(np.sum(b * b)))
    return np.array(out)


def ref_levels(x, scales, s, bucket, stochastic, stream):
    """Levels quantization given the payload's (already rounded) bucket scales."""
    v = x.reshape(-1).astype(np.float32 if x.dtype == np.float16 else x.dtype).astype(np.float64)
    scale = np.repeat(np.asarray(scales, dtype=np.float64), bucket)[: v.size]
    mult = np.where(scale > 0, s / np.where(scale > 0, scale, 1.0), 0.0)
    r = np.abs(v) * mult
    r = r + (uniform24(v.size, stream).astype(np.float64) * (1.0 / 16777216.0) if stochastic else 0.5)
    lev = np.minimum(np.floor(r), s)
    q = np.where(v < 0, -lev, lev) + 0.0  # code q + s cannot say -0
    out = q * (scale / s)
    work = np.float64 if x.dtype == np.float64 else np.float32
    return out.astype(work).astype(x.dtype).reshape(x.shape)


def ref_natural(x, p):
    u = x.reshape(-1).astype(np.float32).view(np.uint32).astype(np.int64)
    a = u & 0x7FFFFFFF
    e = a >> 23
    up = (uniform24(a.size, p["stream"]) >> np.uint64(1)).astype(np.int64) < (a & 0x7FFFFF)
    e = np.where(e < 255, e + up, e)
    bits = np.where(e > 0, ((u >> 31) << 31) | (e << 23), 0).astype(np.uint32)
    return bits.view(np.float32).astype(x.dtype).reshape(x.shape)


def ref_powersgd(x, q0):
    m = x.reshape(x.shape[0], -1) if x.ndim >= 2 else x.reshape(-1, 1)
    m = m.astype(np.float64)
    p_hat = np.linalg.qr(m @ q0)[0]
    return (p_hat @ (m.T @ p_hat).T).reshape(x.shape)


_M64 = (1 << 64) - 1


def _splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _uniform_below(stream, counter, bound):
    h = _splitmix64(stream ^ _splitmix64(counter))
    r = int(float(h >> 11) * (1.0 / 9007199254740992.0) * bound)
    return min(r, bound - 1)


def ref_randomk_indices(n, k, stream):
    """Floyd's algorithm (1987) in plain Python: k distinct indices of range(n), sorted."""
    chosen = set()
    for j in range(n - k, n):
        t = _uniform_below(stream, j, j + 1)
        chosen.add(j if t in chosen else t)
    return np.array(sorted(chosen), dtype=np.int64)


def ref_randomk(x, p):
    flat = x.reshape(-1)
    idx = ref_randomk_indices(flat.size, p["nnz"], p["stream"])
    work = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    out = np.zeros(flat.size, dtype=work)
    out[idx] = flat[idx].astype(work) * work.type(p["scale"])
    return out.astype(x.dtype).reshape(x.shape)


def _finite(a):
    return bool(np.isfinite(a).all())


def ref_error_feedback(encode, decode, xs):
    """Error feedback in plain NumPy around ``encode(c, step)`` / ``decode(payload)``, one step
    per array of ``xs``: ``c = x + e``, ``payload = encode(c)``, ``e = c - decode(payload)``,
    kept only if finite (an overflowed step leaves the residual). ``[(payload, e)]`` per step."""
    e, out = None, []
    for step, x in enumerate(xs):
        e = np.zeros_like(x) if e is None else e
        with np.errstate(over="ignore", invalid="ignore"):
            c = x + e
            payload = encode(c, step)
            new = c - decode(payload).astype(c.dtype)
        e = new if _finite(new) else e
        out.append((payload, e.copy()))
    return out


def ref_dgc_memory(encode, decode, xs, momentum):
    """DGC's momentum correction in plain NumPy: ``u = m u + g``, ``v = v + u``, ``payload =
    encode(v)``, ``u`` and ``v`` cleared where ``decode(payload) != 0``; a non-finite ``v`` leaves
    both as they were. ``[(payload, u, v)]`` per step."""
    u = v = None
    out = []
    for step, g in enumerate(xs):
        if u is None:
            u, v = np.zeros_like(g), np.zeros_like(g)
        with np.errstate(over="ignore", invalid="ignore"):
            u2 = u * momentum
            u2 += g
            v2 = v + u2
            payload = encode(v2, step)
        if _finite(v2):
            sent = decode(payload) != 0
            v2[sent] = 0
            u2[sent] = 0
            u, v = u2, v2
        out.append((payload, u.copy(), v.copy()))
    return out


def ref_dgc_published(xs, momentum, densities, clip):
    """DGC as published (Lin et al. 2018) with exact top-k selection, in plain NumPy: each
    step's gradient scaled to L2 norm ``clip`` when larger (norm in float64; local gradient
    clipping), ``u = m u + g``, ``v = v + u``, the ``k = ceil(d n)`` largest magnitudes of ``v``
    sent (``d`` the step's density from the warm-up), ``u`` and ``v`` cleared where a nonzero
    value was sent. ``[(indices, values, u, v)]`` per step."""
    u = v = None
    out = []
    for g, d in zip(xs, densities):
        with np.errstate(over="ignore", invalid="ignore"):
            norm = float(np.sqrt(np.sum(g.astype(np.float64) ** 2)))
            if clip is not None and np.isfinite(norm) and norm > clip:
                g = (g * (clip / norm)).astype(g.dtype)
            if u is None:
                u, v = np.zeros_like(g), np.zeros_like(g)
            u2 = u * momentum
            u2 += g
            v2 = v + u2
        idx = ref_topk_indices(v2, k_for(v2.size, d))
        values = v2.reshape(-1)[idx].copy()
        if _finite(v2):
            sent = idx[values != 0]
            v2.reshape(-1)[sent] = 0
            u2.reshape(-1)[sent] = 0
            u, v = u2, v2
        out.append((idx, values, u.copy(), v.copy()))
    return out
