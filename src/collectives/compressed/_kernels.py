"""Numba kernels of the sparse allreduce: merging sorted (index, value) lists.

Kept apart from the Python API (which validates its inputs first); they take only arrays and
scalars, with njit options from one constant.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["NJIT", "merge_sum", "add_sparse_into_dense", "split_points"]

NJIT = dict(cache=True, nogil=True)


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


@njit(**NJIT)
def split_points(idx, bounds, out):  # pragma: no cover - compiled
    """``out[b]`` = position of the first index >= ``bounds[b]`` in sorted ``idx``."""
    k = 0
    for b in range(bounds.size):
        while k < idx.size and idx[k] < bounds[b]:
            k += 1
        out[b] = k
