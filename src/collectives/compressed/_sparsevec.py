"""A slice of a vector held sparse (sorted indices + values) or dense, and its wire format.

The sparse allreduce keeps every partial sum in whichever form is smaller on the wire and switches
a vector to dense once ``nnz * (4 + itemsize) >= length * itemsize`` (SparCML's switch). Wire
format: a 16-byte header (``kind``: 0 sparse / 1 dense, ``nnz``) then, sparse, ``nnz`` uint32
indices and ``nnz`` values, or, dense, ``length`` values. ``unpack`` validates everything (kind,
sizes, every index in range and strictly increasing) before any kernel writes with it. The merge
kernels (``_kernels.py``, Numba) are imported at the first merge, not with the package.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SparseVec", "pack", "unpack", "combine"]

_HEADER = 16


@dataclass
class SparseVec:
    """Elements ``lo .. lo + length - 1`` of a vector: sparse (``idx``, ``vals``) or ``dense``."""

    lo: int
    length: int
    dtype: np.dtype
    idx: np.ndarray | None = None     # int64 global indices, strictly increasing
    vals: np.ndarray | None = None
    dense: np.ndarray | None = None

    @property
    def nnz(self) -> int:
        return self.length if self.dense is not None else int(self.idx.size)

    def densify(self) -> "SparseVec":
        if self.dense is None:
            dense = np.zeros(self.length, dtype=self.dtype)
            dense[self.idx - self.lo] = self.vals
            return SparseVec(self.lo, self.length, self.dtype, dense=dense)
        return self

    def balanced(self) -> "SparseVec":
        """Dense if that is no larger on the wire."""
        if self.dense is None and self.nnz * (4 + self.dtype.itemsize) >= self.length * self.dtype.itemsize:
            return self.densify()
        return self

    def write_into(self, out: np.ndarray) -> None:
        """Store these elements into the flat result ``out`` (zeros where sparse has none)."""
        part = out[self.lo:self.lo + self.length]
        if self.dense is not None:
            part[...] = self.dense
        else:
            part[...] = 0
            part[self.idx - self.lo] = self.vals

    def split(self, bounds: list[int]) -> list["SparseVec"]:
        """Cut into the ranges ``[bounds[k], bounds[k+1])`` (``self`` must be sparse, lo = 0)."""
        cuts = np.searchsorted(self.idx, bounds)
        return [SparseVec(bounds[k], bounds[k + 1] - bounds[k], self.dtype,
                          self.idx[cuts[k]:cuts[k + 1]], self.vals[cuts[k]:cuts[k + 1]])
                for k in range(len(bounds) - 1)]


def pack(v: SparseVec) -> np.ndarray:
    """The wire bytes of ``v``."""
    item = v.dtype.itemsize
    if v.dense is not None:
        buf = np.empty(_HEADER + v.length * item, dtype=np.uint8)
        buf[:16].view(np.int64)[:] = (1, v.length)
        buf[16:].view(v.dtype)[:] = v.dense
        return buf
    k = v.nnz
    buf = np.empty(_HEADER + k * (4 + item), dtype=np.uint8)
    buf[:16].view(np.int64)[:] = (0, k)
    buf[16:16 + 4 * k].view(np.uint32)[:] = v.idx - v.lo
    buf[16 + 4 * k:].view(v.dtype)[:] = v.vals
    return buf


def unpack(buf: np.ndarray, lo: int, length: int, dtype: np.dtype) -> SparseVec:
    """Parse and validate wire bytes for elements ``lo .. lo + length - 1``."""
    if buf.size < _HEADER:
        raise ValueError(f"sparse message of {buf.size} bytes is shorter than its header")
    kind, k = (int(v) for v in buf[:16].view(np.int64))
    item = dtype.itemsize
    if kind == 1:
        if k != length or buf.size != _HEADER + length * item:
            raise ValueError(f"dense message of {buf.size} bytes for {length} elements")
        return SparseVec(lo, length, dtype, dense=buf[16:].view(dtype).copy())
    if kind != 0 or not 0 <= k <= length or buf.size != _HEADER + k * (4 + item):
        raise ValueError(f"malformed sparse message (kind {kind}, nnz {k}, {buf.size} bytes)")
    rel = buf[16:16 + 4 * k].view(np.uint32).astype(np.int64)
    if k and (rel[-1] >= length or (k > 1 and not (np.diff(rel) > 0).all())):
        raise ValueError("sparse message has indices out of range or out of order")
    return SparseVec(lo, length, dtype, rel + lo, buf[16 + 4 * k:].view(dtype).copy())


def combine(lower: SparseVec, higher: SparseVec) -> SparseVec:
    """Elementwise sum of two slices of the same range, the lower ranks' operand first.

    Consumes its operands: a dense one's buffer (its own, from :func:`unpack` or
    :meth:`SparseVec.densify`) becomes the result's, so a partial sum that is dense is added into
    in place instead of copied at every step."""
    from ._kernels import add_sparse_into_dense, merge_sum  # Numba, on first use

    if lower.dense is None and higher.dense is None:
        cap = lower.nnz + higher.nnz
        idx, vals = np.empty(cap, np.int64), np.empty(cap, lower.dtype)
        k = merge_sum(lower.idx, lower.vals, higher.idx, higher.vals, idx, vals)
        return SparseVec(lower.lo, lower.length, lower.dtype, idx[:k], vals[:k]).balanced()
    if lower.dense is not None and higher.dense is not None:
        np.add(lower.dense, higher.dense, out=lower.dense)
        return SparseVec(lower.lo, lower.length, lower.dtype, dense=lower.dense)
    dense, sparse = (lower, higher) if lower.dense is not None else (higher, lower)
    add_sparse_into_dense(dense.dense, sparse.idx - sparse.lo, sparse.vals, sparse is lower)
    return SparseVec(lower.lo, lower.length, lower.dtype, dense=dense.dense)
