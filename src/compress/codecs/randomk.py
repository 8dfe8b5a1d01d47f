"""Random-k sparsification with indices shared by all ranks.

How it works: ``k = ceil(ratio * n)`` indices are drawn uniformly without replacement (Floyd's
algorithm, :func:`compress._kernels.sparse.random_subset`) from a stream that is a pure function of
``(seed, key, step)``. Every rank that uses the same seed, tensor key and step draws the same indices,
so only the k values travel and the bodies of different ranks can be added by a plain allreduce. With
``unbiased_scaling=True`` decoding multiplies by ``n / k``, which makes the estimate unbiased
(each index is kept with probability ``k / n``); without it the codec is biased and should be used with
error feedback. Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory", NeurIPS 2018; Wangni et al.,
"Gradient Sparsification for Communication-Efficient Distributed Optimization", NeurIPS 2018.

Non-finite input: k values cannot say that an element they leave out overflowed, so when the input
holds ``±inf`` or NaN anywhere, every sent value is NaN (the k shared indices decode to NaN, and so
does their sum over ranks). Finding out costs one read of the input, which random-k otherwise skips;
with error feedback the pass that computes ``x + e`` finds it out
(:class:`compress.protocols.FusedFeedback`), and the residual is updated at the k indices only.

Wire size: ``header + k * itemsize`` bytes, ``header = 16 + 8 * ndim + 24`` (parameters ``nnz``,
the index stream and the decode scale).

Properties: summable (same indices on every rank; :meth:`RandomK.indices` gives them to a collective
that sums the values itself), unbiased only with ``unbiased_scaling``, error feedback advised
(``needs_error_feedback`` is true unless scaled), aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .._backends import HOST, backend_of, count_nonfinite
from .._layout import Section
from .._seeding import shared_stream
from .._util import check_ratio, k_for, nan_word, quiet, require, uint_view
from ..base import Codec
from ..arrays import namespace
from ..protocols import ElementSummable, FusedFeedback, decoded_into

__all__ = ["RandomK"]


@dataclass(eq=False)
class RandomK(FusedFeedback, ElementSummable, Codec):
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

    def recompressor(self) -> "RandomK":
        """An aggregate of decoded payloads holds values already scaled by ``n / k`` at the
        indices a second encoding at the same ``(key, step)`` draws again: that encoding keeps
        them as they are (scale 1, written in its header), so the estimate stays unbiased."""
        return replace(self, unbiased_scaling=False) if self.unbiased_scaling else self

    def body_nbytes(self, n, dtype):
        return k_for(n, self.ratio) * np.dtype(dtype).itemsize

    def indices(self, n: int, *, key=None, step: int = 0) -> np.ndarray:
        """The sorted int64 indices this codec keeps for an ``n``-element tensor at ``(key, step)``."""
        return HOST.random_subset(n, k_for(n, self.ratio), shared_stream(self.seed, key, step))

    # summable protocol (compress.protocols.ElementSummable): the values at the shared indices
    summable_add = np.add

    def summable_encode(self, x, *, key=None, step: int = 0) -> np.ndarray:
        ops = backend_of(x)
        x = self._prepare(x, ops).reshape(-1)
        work = np.float32 if x.dtype == np.float16 else x.dtype
        rep = x[namespace(x).asarray(self.indices(x.size, key=key, step=step))].astype(work)
        if count_nonfinite(x):
            rep.fill(np.nan)
        return rep

    def summable_decode(self, rep, *, shape, dtype, key=None, step: int = 0,
                        out=None) -> np.ndarray:
        n = int(np.prod(shape))
        xp = namespace(rep)
        idx = self.indices(n, key=key, step=step)
        if rep.shape != idx.shape:
            raise ValueError(f"representation has {rep.size} values, expected {idx.size}")
        dense = xp.zeros(n, dtype=rep.dtype)
        dense[xp.asarray(idx)] = rep * (n / idx.size if (self.unbiased_scaling and idx.size) else 1)
        return decoded_into(dense.astype(dtype, copy=False).reshape(shape), out, shape)

    def _sections(self, n, dtype, params):
        return [Section("values", dtype, params["nnz"])]

    def _check_params(self, hdr):
        p = hdr.params
        require(p["nnz"] <= hdr.count, f"nnz {p['nnz']} exceeds the element count {hdr.count}")
        require(np.isfinite(p["scale"]), f"decode scale {p['scale']} is not finite")

    def _encode(self, x, ops, key, step, out):
        """The k indices are drawn on the host (Floyd's algorithm is sequential, O(k)) and, for a
        device ``x``, copied to the device."""
        return self._emit(x, ops, key, step, out, None)[0]

    def _encode_source(self, src, key, step, out):
        """Random-k selects nothing from the data: the pass computes the tensor and says whether
        it holds inf or NaN (the read that :meth:`_encode` spends on it)."""
        src.run()
        buf, idx, values, scale = self._emit(src.tensor, HOST, key, step, out, src.nonfinite)
        work = np.dtype(np.float32) if src.dtype == np.float16 else src.dtype
        with quiet():  # what decode writes: v * scale in the work dtype, rounded to the tensor's
            sent = (values.astype(work) * work.type(scale)).astype(src.dtype)
        return buf, idx, sent

    def _emit(self, x, ops, key, step, out, nonfinite: bool | None):
        """``(payload, indices, values, scale)`` of ``x``; ``nonfinite``: whether ``x`` holds inf
        or NaN (None: find out)."""
        n = x.size
        k = k_for(n, self.ratio)
        stream = shared_stream(self.seed, key, step)
        scale = n / k if (self.unbiased_scaling and k) else 1.0
        buf, body = self._new_payload(x, out, {"nnz": k, "stream": stream, "scale": scale}, ops)
        u, _ = uint_view(x)
        values = body["values"].view(u.dtype)
        idx = HOST.random_subset(n, k, stream)
        ops.gather(u, ops.from_host(idx), values)
        if count_nonfinite(x) if nonfinite is None else nonfinite:
            ops.fill(values, nan_word(x.dtype))
        return buf, idx, body["values"], scale

    def _decode(self, hdr, body, ops):
        k = hdr.params["nnz"]
        idx = HOST.random_subset(hdr.count, k, hdr.params["stream"])
        work = np.dtype(np.float32) if hdr.dtype == np.float16 else hdr.dtype
        out = ops.zeros(hdr.count, work)
        ops.scatter_scaled(ops.astype(body["values"], work), ops.from_host(idx),
                           work.type(hdr.params["scale"]), out)
        return ops.astype(out, hdr.dtype)
