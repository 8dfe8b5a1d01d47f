"""Sources: the tensor a memory compresses, computed by the pass that selects from it (private).

A memory (:mod:`compress.memory`) hands a codec that speaks
:class:`compress.protocols.FusedFeedback` a *source* instead of a finished tensor ``c``: the
inputs ``c`` is made of and a buffer to write it into. The codec asks the source for

* ``keys_at(pos)``: magnitude keys of ``c`` at a few positions (its sample, computed there by
  NumPy, before ``c`` exists);
* ``run(thr, cap)``: one pass (:mod:`.fused`) that writes ``c`` into ``values`` and returns how
  many magnitude keys reach the threshold and their ascending indices (at most ``cap``), and
  says whether ``c`` holds inf or NaN;

and then selects from ``values`` as its own encode would from ``c``. :class:`Compensated` is
error feedback's ``c = x + e`` (``e`` None: ``c = x``, the first step of two-phase's server);
:class:`Momentum` is DGC's ``u' = u m + g``, ``c = v + u'``. Float16 tensors are computed by
NumPy and then scanned (the kernels do no float16 arithmetic), so their bits are NumPy's by
construction; float32 and float64 ones by the fused kernels, whose IEEE operations are NumPy's.

:func:`topk` is top-k's selection on a source: the strided sample, threshold and exact selection
of :func:`.sparse.topk_indices`, with the collecting pass fused into ``run``.
"""

from __future__ import annotations

import threading

import numpy as np

from .._util import inf_word, quiet, uint_view
from . import fused, sparse
from ..stream import streaming

__all__ = ["Source", "Compensated", "Momentum", "Scan", "topk", "sample_keys"]


_SCRATCH = threading.local()


def scratch(name: str, size: int, dtype) -> np.ndarray:
    """A buffer of ``size`` elements of ``dtype`` that this thread reuses from call to call
    (contents undefined; valid until the thread asks for ``name`` again). A fresh array of a few
    MB per call costs a page fault per 4 KiB on first touch, inside the scan."""
    dtype = np.dtype(dtype)
    cache = getattr(_SCRATCH, "buffers", None)
    if cache is None:
        cache = _SCRATCH.buffers = {}
    buf = cache.get((name, dtype))
    if buf is None or buf.size < size:
        buf = cache[(name, dtype)] = np.empty(max(size, 1024), dtype=dtype)
    return buf[:size]


class Scan:
    """What :meth:`Source.run` found: ``count`` keys reach the threshold; ``cand`` holds the
    ascending indices of the first of them (all of them when ``complete``), ``bits`` the bits of
    their values."""

    __slots__ = ("count", "cand", "bits", "complete")

    def __init__(self, count: int, cand: np.ndarray, bits: np.ndarray, cap: int):
        kept = min(count, cap)
        self.count, self.cand, self.bits = count, cand[:kept], bits[:kept]
        self.complete = count <= cap


class Source:
    """A tensor computed by :meth:`run` into ``tensor`` (the memory's buffer, in the tensor's
    shape; ``values`` is it flat, ``bits`` its unsigned view)."""

    nonfinite: bool = False

    def __init__(self, out: np.ndarray):
        self.tensor = out
        self.values = out.reshape(-1)
        self.bits, self.absmask = uint_view(out)

    @property
    def size(self) -> int:
        return self.values.size

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    def keys_at(self, pos: np.ndarray) -> np.ndarray:
        """Magnitude keys of the tensor at the int64 positions ``pos``."""
        if self.dtype == np.float16:
            with quiet():
                at = self._at(pos)
            return uint_view(at)[0] & self.absmask
        keys = np.empty(pos.size, dtype=self.bits.dtype)
        self._keys_at(pos, keys)
        return keys

    def run(self, thr=None, cap: int = 0) -> Scan:
        """Compute the tensor into ``values``, collecting the elements whose magnitude keys reach
        ``thr`` (None: none)."""
        cap = 0 if thr is None else cap
        cand = scratch("cand", cap + 1, np.int64)  # + 1: the slot of the kernels' spare stores
        bits = scratch("bits", cap + 1, self.bits.dtype)
        inf = inf_word(self.dtype)
        key = self.bits.dtype.type(inf if thr is None else thr)
        if key > inf:  # a NaN's key: float comparisons cannot say "key >= thr"; keys can
            nonfinite, _ = self._pass(inf, cand[:1], bits[:1])
            count = self._scan(key, cand, bits)[1]
        else:
            nonfinite, count = self._pass(key, cand, bits)
        self.nonfinite = bool(nonfinite)
        return Scan(int(count) if thr is not None else 0, cand, bits, cap)

    def _scan(self, key, cand, bits):
        """The statistics of ``values`` already computed (float16, or a plain copy)."""
        return fused.scan(self.bits, self.absmask, inf_word(self.dtype), key, cand, bits)

    def _float(self, key):
        """The magnitude whose key is ``key``: the float threshold of the fused kernels."""
        return np.array(key).view(self.dtype)[()]

    def _at(self, pos):  # pragma: no cover - abstract
        """The tensor at ``pos`` by NumPy (float16)."""
        raise NotImplementedError

    def _keys_at(self, pos, keys):  # pragma: no cover - abstract
        """Its magnitude keys at ``pos`` by a kernel (float32, float64)."""
        raise NotImplementedError

    def _pass(self, key, cand, bits):  # pragma: no cover - abstract
        raise NotImplementedError


class Compensated(Source):
    """Error feedback's ``c = x + e`` (``x + 0`` turns ``-0.0`` into ``+0.0``, as NumPy does);
    with ``e`` None, ``c = x`` (copied)."""

    def __init__(self, x: np.ndarray, e: np.ndarray | None, out: np.ndarray):
        super().__init__(out)
        self.x = x.reshape(-1)
        self.e = None if e is None else e.reshape(-1)

    def _at(self, pos):
        return self.x[pos] if self.e is None else self.x[pos] + self.e[pos]

    def _keys_at(self, pos, keys):
        if self.e is None:
            keys[...] = uint_view(self.x[pos])[0] & self.absmask
        else:
            fused.compensate_at(self.x, self.e, pos, self.absmask, keys)

    def _pass(self, key, cand, bits):
        if self.e is None:
            np.copyto(self.values, self.x)
        elif self.dtype == np.float16:
            with quiet():
                np.add(self.x, self.e, out=self.values)
        else:
            return fused.compensate_scan(self.x, self.e, self.values, self._float(key), cand,
                                         bits, *streaming(self.values))
        return self._scan(key, cand, bits)


class Momentum(Source):
    """DGC's momentum correction: ``u_out = u * momentum + g`` and ``c = v + u_out`` (``values``),
    the operations of ``compress.DGCMemory`` in its order."""

    def __init__(self, g: np.ndarray, u: np.ndarray, v: np.ndarray, u_out: np.ndarray,
                 out: np.ndarray, momentum: float):
        super().__init__(out)
        self.g, self.u, self.v = g.reshape(-1), u.reshape(-1), v.reshape(-1)
        self.u_out = u_out.reshape(-1)
        self.momentum = momentum

    def _at(self, pos):
        a = self.u[pos] * self.momentum
        a += self.g[pos]
        return self.v[pos] + a

    def _keys_at(self, pos, keys):
        fused.momentum_at(self.g, self.u, self.v, self.dtype.type(self.momentum), pos,
                          self.absmask, keys)

    def _pass(self, key, cand, bits):
        if self.dtype == np.float16:
            with quiet():
                np.multiply(self.u, self.momentum, out=self.u_out)
                self.u_out += self.g
                np.add(self.v, self.u_out, out=self.values)
            return self._scan(key, cand, bits)
        m = self.dtype.type(self.momentum)  # NumPy's array * Python float: the float in the dtype
        return fused.momentum_scan(self.g, self.u, self.v, self.u_out, self.values, m,
                                   self._float(key), cand, bits,
                                   *streaming(self.values))


def sample_keys(src: Source, m: int, stream) -> np.ndarray:
    """The keys :func:`.sparse.sample_keys` draws from the finished tensor (``m`` positions of
    ``stream``), sorted descending, computed where they are."""
    pos = np.empty(m, dtype=np.int64)
    fused.random_positions(src.size, m, np.uint64(stream), pos)
    return np.sort(src.keys_at(pos))[::-1].copy()


def topk(src: Source, k: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``(indices, bits)``: the ascending int64 indices of the exact top-``k`` keys of the source
    (ties to the lower index), the result of :func:`.sparse.topk_indices` on the finished tensor,
    and the bits of the values there (None when the selection ran over the finished tensor).

    The threshold comes from a strided sample of ``_SAMPLE`` keys: about ``r = k S / n`` of them
    lie above the k-th largest key; the threshold is the key ``r + 6 sqrt(r) + 16`` from the top,
    so that (for a sample that represents the data) fewer than ``k`` candidates pass about once in
    10^9 calls, and the candidates are little more than ``k`` (:func:`.sparse.topk_indices` takes
    ``2 k``: it reads the candidates' keys back from the tensor, here they come with the pass)."""
    n = src.size
    thr, cap = None, 0
    if 0 < k < n and n > 4 * sparse._SAMPLE:
        stride = n // sparse._SAMPLE
        sample = src.keys_at(np.arange(sparse._SAMPLE, dtype=np.int64) * stride)
        r = k * sparse._SAMPLE / n
        above = int(np.ceil(r + 6.0 * np.sqrt(r) + 16.0))  # sample keys at or above thr
        if above < sparse._SAMPLE:
            thr = np.partition(sample, sparse._SAMPLE - above)[sparse._SAMPLE - above]
            cap = 2 * (above * n // sparse._SAMPLE) + 1024  # twice the candidates expected
    scan = src.run(thr, cap)
    if thr is not None and scan.complete and scan.count >= k:
        idx, bits = scratch("idx", k + 1, np.int64), scratch("sent", k + 1, src.bits.dtype)
        keys = np.bitwise_and(scan.bits, src.absmask, out=scratch("keys", scan.bits.size,
                                                                   scan.bits.dtype))
        keys.partition(keys.size - k)  # in place; NumPy's is SIMD, Numba's is not
        v = keys[keys.size - k]
        fused.select_collected(scan.cand, scan.bits, src.absmask, v, k, idx, bits)
        return idx[:k], bits[:k]
    # too few candidates or too many (or none asked for): the selection over every element
    idx = np.empty(k, dtype=np.int64)
    sparse.topk_indices(src.bits, src.absmask, k, idx)
    return idx, None
