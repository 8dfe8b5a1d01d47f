"""Deep Gradient Compression's sparsifier: sampled threshold refined toward a target density.

How it works: a random sample of ``max(ceil(sample_ratio * n), 256)`` magnitudes (at most n) gives a
threshold at the sample's ``density`` quantile. One counting pass checks how many elements reach it:
above ``1.25 k`` (``k = ceil(density * n)``) the codec keeps the exact top-k among those candidates
(DGC's hierarchical selection); below ``0.75 k`` it moves the threshold down the sample (rank doubled,
at most 4 times) and counts again; otherwise it sends every element above the threshold. So ``nnz`` is
data dependent but close to ``k``. Momentum correction and momentum factor masking are the memory
class :class:`compress.DGCMemory`. Lin, Han, Mao, Wang & Dally, "Deep Gradient Compression: Reducing
the Communication Bandwidth for Distributed Training", ICLR 2018.

Wire size: ``header + nnz * (4 + itemsize)`` bytes, ``header = 16 + 8 * ndim + 8``; body as top-k
(values, then strictly increasing uint32 indices).

Properties: not summable, biased, needs error feedback (DGCMemory), aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._kernels.sparse import collect_at_least, count_at_least, sample_keys, select_from_candidates
from .._seeding import draw_stream, make_generator
from .._util import check_ratio, k_for, uint_view
from ._sparse import SparseCodec

__all__ = ["DGC"]

_MIN_SAMPLE = 256
_REFINE = 4


@dataclass(eq=False)
class DGC(SparseCodec):
    """DGC sparsification.

    Parameters
    ----------
    density : float
        Target fraction of elements sent, in (0, 1] (the paper uses 0.001).
    sample_ratio : float
        Fraction of elements sampled for the threshold, in (0, 1].
    seed : None, int or numpy.random.Generator
        Source of the sample positions.
    """

    density: float = 0.001
    sample_ratio: float = 0.01
    seed: object = None
    _rng: np.random.Generator = field(init=False, repr=False)

    name = "dgc"
    codec_id = 7
    randomness = "private"
    sparse = True
    needs_error_feedback = True

    def __post_init__(self):
        check_ratio("density", self.density)
        check_ratio("sample_ratio", self.sample_ratio)
        self._rng = make_generator(self.seed)

    def _encode(self, x, key, step, out):
        return self._emit(x, out, self._select(x, _HOST))

    def _encode_device(self, x, dev, key, step, out):
        from .._kernels.cuda import ops

        return self._emit_device(x, dev, out, self._select(x, ops, dev))

    def _select(self, x, kernels, dev=None):
        """The sent indices (int64, ascending), with the host or the device ``kernels``."""
        extra = () if dev is None else (dev,)
        n = x.size
        k = k_for(n, self.density)
        if k == 0:
            return np.empty(0, dtype=np.int64) if dev is None else dev.empty(0, np.int64)
        u, absmask = uint_view(x)
        m = min(n, max(_MIN_SAMPLE, int(np.ceil(self.sample_ratio * n))))
        sample = kernels.sample_keys(u, absmask, m, np.uint64(draw_stream(self._rng)), *extra)
        rank = min(m - 1, k_for(m, self.density) - 1)
        for attempt in range(_REFINE + 1):
            thr = sample[rank]
            cnt = kernels.count_at_least(u, absmask, thr, *extra)
            if cnt >= 0.75 * k or rank == m - 1 or attempt == _REFINE:
                break
            rank = min(m - 1, 2 * rank + 1)
        cand = kernels.collect_at_least(u, absmask, thr, cnt, *extra)
        if cnt > 1.25 * k:
            cand = kernels.select_among(u, absmask, cand, k, *extra)
        return cand


class _HOST:
    """The host kernels with the call shapes of :mod:`compress._kernels.cuda.ops` (allocating)."""

    sample_keys = staticmethod(sample_keys)
    count_at_least = staticmethod(count_at_least)

    @staticmethod
    def collect_at_least(u, absmask, thr, count):
        cand = np.empty(count, dtype=np.int64)
        collect_at_least(u, absmask, thr, cand)
        return cand

    @staticmethod
    def select_among(u, absmask, cand, k):
        idx = np.empty(k, dtype=np.int64)
        select_from_candidates(u, absmask, cand, k, idx)
        return idx
