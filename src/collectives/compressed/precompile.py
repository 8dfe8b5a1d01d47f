"""The kernels of a compressed allreduce with top-k and error feedback, compiled in one process.

:func:`topk_with_feedback` runs what the first such call of a job runs, on 1000 and on 300 000
elements (top-k's exact and sampled selections) and on ``COMM_SELF``: two steps of ``compress.ErrorFeedback`` around top-k (the fused path: the first
step and one with a residual), then the sparse strategy's merges of two ranks' (index, value)
lists, sparse with sparse and sparse into dense, as the ranks of a job do. ``python -m
collectives warmup`` calls it per dtype (``collectives.tools.warmup``) to fill Numba's cache.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import compress

from ._sparsevec import SparseVec, combine
from .api import compressed_allreduce
from .sparse import _acc

__all__ = ["topk_with_feedback"]


def topk_with_feedback(dtype: np.dtype) -> bool:
    """Run the path for ``dtype``; False (and nothing run) where top-k does not take it."""
    memory = compress.ErrorFeedback(compress.from_spec("topk:ratio=0.01"))
    if dtype not in memory.codec.dtypes:
        return False
    # top-k estimates its threshold from a strided sample above 4 x 65536 elements and selects
    # among all elements below: other kernels each, so a short and a long tensor
    for n in (1000, 300_000):
        x = np.linspace(-1, 1, n).astype(dtype)
        for _ in range(2):  # the first step and a step with a residual
            compressed_allreduce(x, memory, key=n, comm=MPI.COMM_SELF)
    acc = _acc(x)
    idx = np.arange(0, 10, 2, dtype=np.int64)

    def vec(ix: np.ndarray) -> SparseVec:
        return SparseVec(0, 100, acc, ix.copy(), np.ones(ix.size, acc))

    combine(vec(idx), vec(idx + 1))                # sparse + sparse: merge_sum
    combine(vec(idx).densify(), vec(idx + 1))      # dense + sparse: add_sparse_into_dense
    return True
