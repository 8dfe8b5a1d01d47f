"""Random-k sparsification with indices shared by all ranks.

How it works: ``k = ceil(ratio * n)`` indices are drawn uniformly without replacement (Floyd's
algorithm, :func:`compress._kernels.sparse.random_subset`) from a stream that is a pure function of
``(seed, key, step)``. Every rank that uses the same seed, tensor key and step draws the same indices,
so only the k values travel and the bodies of different ranks can be added by a plain allreduce. With
``unbiased_scaling=True`` decoding multiplies by ``n / k``, which makes the estimate unbiased
(each index is kept with probability ``k / n``); without it the codec is biased and should be used with
error feedback. Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory", NeurIPS 2018; Wangni et al.,
"Gradient Sparsification for Communication-Efficient Distributed Optimization", NeurIPS 2018.

Wire size: ``header + k * itemsize`` bytes, ``header = 16 + 8 * ndim + 24`` (parameters ``nnz``,
the index stream and the decode scale).

Properties: summable (same indices on every rank; :meth:`RandomK.indices` gives them to a collective
that sums the values itself), unbiased only with ``unbiased_scaling``, error feedback advised
(``needs_error_feedback`` is true unless scaled), aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._kernels.sparse import gather, random_subset, scatter_scaled
from .._device import namespace
from .._layout import Section
from .._seeding import shared_stream
from .._util import check_ratio, k_for, require, uint_view
from ..base import Codec

__all__ = ["RandomK"]


@dataclass(eq=False)
class RandomK(Codec):
    """Random-k with shared indices.

    Parameters
    ----------
    ratio : float
        Fraction of elements kept, in (0, 1].
    seed : int
        Shared seed: must be the same on every rank.
    unbiased_scaling : bool
        Scale decoded values by ``n / k`` (unbiased estimator).
    """

    ratio: float = 0.01
    seed: int = 0
    unbiased_scaling: bool = False

    name = "randomk"
    codec_id = 5
    randomness = "shared"
    summable = True
    PARAMS = (("nnz", "Q"), ("stream", "Q"), ("scale", "d"))

    def __post_init__(self):
        check_ratio("ratio", self.ratio)
        if not isinstance(self.seed, (int, np.integer)):
            raise ValueError(f"randomk needs an int seed shared by all ranks, got {type(self.seed).__name__}")

    @property
    def unbiased(self) -> bool:
        return bool(self.unbiased_scaling)

    @property
    def needs_error_feedback(self) -> bool:
        return not self.unbiased_scaling

    def body_nbytes(self, n, dtype):
        return k_for(n, self.ratio) * np.dtype(dtype).itemsize

    def indices(self, n: int, *, key=None, step: int = 0) -> np.ndarray:
        """The sorted int64 indices this codec keeps for an ``n``-element tensor at ``(key, step)``."""
        k = k_for(n, self.ratio)
        idx = np.empty(k, dtype=np.int64)
        random_subset(n, k, np.uint64(shared_stream(self.seed, key, step)), idx)
        return idx

    # summable protocol (see compress.base): the values at the shared indices
    summable_add = np.add

    def summable_encode(self, x, *, key=None, step: int = 0) -> np.ndarray:
        x = self._prepare_any(x).reshape(-1)
        work = np.float32 if x.dtype == np.float16 else x.dtype
        return x[namespace(x).asarray(self.indices(x.size, key=key, step=step))].astype(work)

    def summable_decode(self, rep, *, shape, dtype, key=None, step: int = 0) -> np.ndarray:
        n = int(np.prod(shape))
        xp = namespace(rep)
        idx = self.indices(n, key=key, step=step)
        if rep.shape != idx.shape:
            raise ValueError(f"representation has {rep.size} values, expected {idx.size}")
        out = xp.zeros(n, dtype=rep.dtype)
        out[xp.asarray(idx)] = rep * (n / idx.size if (self.unbiased_scaling and idx.size) else 1)
        return out.astype(dtype, copy=False).reshape(shape)

    def _sections(self, n, dtype, params):
        return [Section("values", dtype, params["nnz"])]

    def _check_params(self, hdr):
        p = hdr.params
        require(p["nnz"] <= hdr.count, f"nnz {p['nnz']} exceeds the element count {hdr.count}")
        require(np.isfinite(p["scale"]), f"decode scale {p['scale']} is not finite")

    def _encode(self, x, key, step, out):
        n = x.size
        k = k_for(n, self.ratio)
        stream = shared_stream(self.seed, key, step)
        scale = n / k if (self.unbiased_scaling and k) else 1.0
        buf, body = self._new_payload(x, out, {"nnz": k, "stream": stream, "scale": scale})
        idx = np.empty(k, dtype=np.int64)
        random_subset(n, k, np.uint64(stream), idx)
        u, _ = uint_view(x)
        gather(u, idx, body["values"].view(u.dtype))
        return buf

    def _encode_device(self, x, dev, key, step, out):
        """As on the host; the k indices are drawn on the host (Floyd's algorithm is sequential,
        O(k)) and copied to the device."""
        from .._kernels.cuda import blocks, elementwise

        n = x.size
        k = k_for(n, self.ratio)
        stream = shared_stream(self.seed, key, step)
        scale = n / k if (self.unbiased_scaling and k) else 1.0
        buf, body = self._new_payload(x, out, {"nnz": k, "stream": stream, "scale": scale}, dev=dev)
        if k:
            idx = np.empty(k, dtype=np.int64)
            random_subset(n, k, np.uint64(stream), idx)
            u, _ = uint_view(x)
            dev.launch(elementwise.gather, blocks(k), u, dev.to_device(idx), body["values"].view(u.dtype))
        return buf

    def _decode_device(self, hdr, body, dev):
        from .._kernels.cuda import blocks, elementwise

        k = hdr.params["nnz"]
        work = np.dtype(np.float32) if hdr.dtype == np.float16 else hdr.dtype
        out = dev.zeros(hdr.count, work)
        if k:
            idx = np.empty(k, dtype=np.int64)
            random_subset(hdr.count, k, np.uint64(hdr.params["stream"]), idx)
            dev.launch(elementwise.scatter_scaled, blocks(k), dev.astype(body["values"], work),
                       dev.to_device(idx), work.type(hdr.params["scale"]), out)
        return dev.astype(out, hdr.dtype)

    def _decode(self, hdr, body):
        k = hdr.params["nnz"]
        idx = np.empty(k, dtype=np.int64)
        random_subset(hdr.count, k, np.uint64(hdr.params["stream"]), idx)
        work = np.dtype(np.float32) if hdr.dtype == np.float16 else hdr.dtype
        out = np.zeros(hdr.count, dtype=work)
        scatter_scaled(body["values"].astype(work, copy=False), idx, work.type(hdr.params["scale"]), out)
        return out.astype(hdr.dtype, copy=False)
