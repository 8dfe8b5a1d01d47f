"""Top-k sparsification: keep the k entries of largest magnitude.

How it works: ``k = ceil(ratio * n)`` (at least one for non-empty input). The kernel
(:func:`compress._kernels.sparse.topk_indices`) estimates a magnitude threshold from a strided sample of
65536 elements so that about ``2k`` elements pass, collects the passing indices in one pass that skips
64-element blocks whose maximum is below the threshold, and runs an exact selection on the candidates;
if the estimate misses it selects over all elements, so the result is always the exact top-k (ties
between equal magnitudes go to the lower index). Magnitudes are compared as integer bit patterns of
``|x|``, so NaN counts as larger than infinity. Top-k is biased and needs error feedback (Stich,
Cordonnier & Jaggi, "Sparsified SGD with Memory", NeurIPS 2018; Aji & Heafield, "Sparse Communication
for Distributed Gradient Descent", EMNLP 2017).

Wire size: ``header + k * (4 + itemsize)`` bytes with ``header = 16 + 8 * ndim + 8`` (one parameter,
``nnz = k``). Body: k values (input dtype), then k uint32 indices, strictly increasing.

Properties: not summable (each rank picks different indices: allgather or a sparse allreduce), biased,
needs error feedback, aggregation "mean".

With a memory (:class:`compress.protocols.FusedFeedback`): the pass that computes ``x + e`` also
collects the candidates, with their values, above a threshold from a strided sample of the sum;
the exact selection runs on those alone (:func:`compress._kernels.sources.topk`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._backends import HOST
from .._util import check_ratio, k_for, uint_view
from ..protocols import FusedFeedback
from ._sparse import SparseCodec

__all__ = ["TopK"]


@dataclass(eq=False)
class TopK(FusedFeedback, SparseCodec):
    """Exact top-k by magnitude.

    Parameters
    ----------
    ratio : float
        Fraction of elements kept, in (0, 1].
    """

    ratio: float = 0.01

    name = "topk"
    codec_id = 4
    needs_error_feedback = True
    sends_values = True

    def __post_init__(self):
        check_ratio("ratio", self.ratio)

    def _default_nnz(self, n):
        return k_for(n, self.ratio)

    def _encode(self, x, ops, key, step, out):
        u, absmask = uint_view(x)
        return self._emit(x, ops, out, ops.topk_indices(u, absmask, k_for(x.size, self.ratio)))

    def _encode_source(self, src, key, step, out):
        idx, bits = HOST.source_topk(src, k_for(src.size, self.ratio))
        return self._emit_sent(src.tensor, HOST, out, idx, bits)
