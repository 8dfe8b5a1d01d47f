"""Deep Gradient Compression's sparsifier: sampled threshold refined toward a target density.

How it works: a random sample of ``max(ceil(sample_ratio * n), 256)`` magnitudes (at most n) gives a
threshold at the sample's ``density`` quantile. One counting pass checks how many elements reach it:
above ``1.25 k`` (``k = ceil(density * n)``) the codec keeps the exact top-k among those candidates
(DGC's hierarchical selection); below ``0.75 k`` it moves the threshold down the sample (rank doubled,
at most 4 times) and counts again; otherwise it sends every element above the threshold. So ``nnz`` is
data dependent but close to ``k``. Momentum correction and momentum factor masking are the memory
class :class:`compress.DGCMemory`; with it, or with error feedback, the pass that computes the
velocity (or ``x + e``) also counts and collects at the first threshold
(:class:`compress.protocols.FusedFeedback`). Lin, Han, Mao, Wang & Dally, "Deep Gradient
Compression: Reducing the Communication Bandwidth for Distributed Training", ICLR 2018.

Wire size: ``header + nnz * (4 + itemsize)`` bytes, ``header = 16 + 8 * ndim + 8``; body as top-k
(values, then strictly increasing uint32 indices).

Properties: not summable, biased, needs error feedback (DGCMemory), aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._backends import HOST
from .._seeding import draw_stream
from .._util import check_ratio, k_for, uint_view
from ..protocols import FusedFeedback
from ._private import PrivateRandom
from ._sparse import SparseCodec

__all__ = ["DGC"]

_MIN_SAMPLE = 256
_REFINE = 4


@dataclass(eq=False)
class DGC(PrivateRandom, FusedFeedback, SparseCodec):
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

    name = "dgc"
    codec_id = 7
    needs_error_feedback = True
    sends_values = True

    def _check(self):
        check_ratio("density", self.density)
        check_ratio("sample_ratio", self.sample_ratio)

    def _encode(self, x, ops, key, step, out):
        return self._emit(x, ops, out, self._select(x, ops))

    def _select(self, x, ops):
        """The sent indices (int64, ascending, of the backend ``ops``)."""
        n = x.size
        k = k_for(n, self.density)
        if k == 0:
            return ops.empty(0, np.int64)
        u, absmask = uint_view(x)
        m = self._sample_size(n)
        sample = ops.sample_keys(u, absmask, m, np.uint64(draw_stream(self._rng)))
        thr, cnt = self._threshold(sample, self._ladder(m, k), k,
                                   lambda step, thr: ops.count_at_least(u, absmask, thr))
        cand = ops.collect_at_least(u, absmask, thr, cnt)
        if cnt > 1.25 * k:
            cand = ops.select_among(u, absmask, cand, k)
        return cand

    def _encode_source(self, src, key, step, out):
        """:meth:`_select` on a memory's source: the sample is computed where it is drawn; the
        pass that computes the tensor counts and collects at the first threshold; a lower one,
        when too few elements reach that, is counted (and collected) on the finished tensor."""
        n = src.size
        k = k_for(n, self.density)
        if k == 0:
            src.run()
            return self._emit_sent(src.tensor, HOST, out, np.empty(0, np.int64))
        m = self._sample_size(n)
        sample = HOST.source_sample(src, m, draw_stream(self._rng))
        ladder = self._ladder(m, k)
        scan = src.run(sample[ladder[0]], 2 * k + 1024)
        u, absmask = src.bits, src.absmask
        thr, cnt = self._threshold(sample, ladder, k, lambda step, thr: scan.count if step == 0
                                   else HOST.count_at_least(u, absmask, thr))
        if thr == sample[ladder[0]] and scan.complete:
            cand = scan.cand
        else:
            cand = HOST.collect_at_least(u, absmask, thr, cnt)
        if cnt > 1.25 * k:
            cand = HOST.select_among(u, absmask, cand, k)
        return self._emit_sent(src.tensor, HOST, out, cand)

    def _sample_size(self, n: int) -> int:
        return min(n, max(_MIN_SAMPLE, int(np.ceil(self.sample_ratio * n))))

    def _ladder(self, m: int, k: int) -> list[int]:
        """The sample ranks whose keys the threshold tries, in order: the target density's, then
        doubled (plus one) while too few elements pass, at most ``_REFINE`` times."""
        rank = min(m - 1, k_for(m, self.density) - 1)
        ranks = [rank]
        while len(ranks) <= _REFINE and rank != m - 1:
            rank = min(m - 1, 2 * rank + 1)
            ranks.append(rank)
        return ranks

    @staticmethod
    def _threshold(sample, ladder, k: int, count) -> tuple:
        """``(threshold, count)``: the first key of the ladder that at least ``0.75 k`` elements
        reach, else its last; ``count(step, thr)`` counts the elements reaching ``thr``."""
        for step, rank in enumerate(ladder):
            thr = sample[rank]
            cnt = count(step, thr)
            if cnt >= 0.75 * k:
                break
        return thr, cnt
