"""Threshold quantization (Strom 2015): send index and sign of entries with ``|x| >= tau``.

How it works: every element whose magnitude reaches the fixed threshold ``tau`` is sent as one 32-bit
word ``index << 1 | sign``, and decodes to ``±tau``; everything else decodes to zero. The difference
stays in the residual, so it must be used with error feedback (:class:`compress.ErrorFeedback`).
Strom, "Scalable Distributed DNN Training Using Commodity GPU Cloud Computing", Interspeech 2015.
The number of words is data dependent (``nnz``) and is in the header.

Wire size: ``header + 4 * nnz`` bytes, ``header = 16 + 8 * ndim + 16`` (nnz and tau). Inputs are
limited to ``2**31 - 1`` elements (31-bit indices).

Properties: not summable, biased, needs error feedback, aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._kernels.sparse import collect_at_least, count_at_least, first_bad_index, scatter
from .._layout import Section
from .._util import require, uint_view
from ..base import Codec

__all__ = ["Threshold"]


@dataclass(eq=False)
class Threshold(Codec):
    """Strom's threshold quantization.

    Parameters
    ----------
    tau : float
        Threshold, > 0. Elements with ``|x| >= tau`` are sent as ``±tau``.
    """

    tau: float = 1e-3

    name = "threshold"
    codec_id = 6
    sparse = True
    needs_error_feedback = True
    PARAMS = (("nnz", "Q"), ("tau", "d"))

    def __post_init__(self):
        require(np.isfinite(self.tau) and self.tau > 0, f"tau must be finite and > 0, got {self.tau!r}")

    def body_nbytes(self, n, dtype, nnz):
        return 4 * int(nnz)

    def _sections(self, n, dtype, params):
        return [Section("words", np.uint32, params["nnz"])]

    def _check_params(self, hdr):
        p = hdr.params
        require(hdr.count < 1 << 31, f"threshold payloads hold at most 2**31 - 1 elements, not {hdr.count}")
        require(p["nnz"] <= hdr.count, f"nnz {p['nnz']} exceeds the element count {hdr.count}")
        require(np.isfinite(p["tau"]) and p["tau"] > 0, f"tau {p['tau']} must be finite and > 0")

    def _encode(self, x, key, step, out):
        require(x.size < 1 << 31, f"threshold takes at most 2**31 - 1 elements, not {x.size}")
        u, absmask = uint_view(x)
        thr = np.array(self.tau, dtype=x.dtype).view(u.dtype)[()]
        nnz = count_at_least(u, absmask, thr)
        idx = np.empty(nnz, dtype=np.int64)
        collect_at_least(u, absmask, thr, idx)
        buf, body = self._new_payload(x, out, {"nnz": nnz, "tau": float(self.tau)})
        sign = (u[idx] >> (8 * x.dtype.itemsize - 1)).astype(np.uint32)
        body["words"][:] = (idx.astype(np.uint32) << np.uint32(1)) | sign
        return buf

    def _encode_device(self, x, dev, key, step, out):
        from .._kernels.cuda import blocks, elementwise, ops

        require(x.size < 1 << 31, f"threshold takes at most 2**31 - 1 elements, not {x.size}")
        u, absmask = uint_view(x)
        thr = int(np.array(self.tau, dtype=x.dtype).view(u.dtype)[()])
        idx = ops.collect_at_least(u, int(absmask), thr, None, dev)
        buf, body = self._new_payload(x, out, {"nnz": idx.size, "tau": float(self.tau)}, dev=dev)
        if idx.size:
            dev.launch(elementwise.threshold_words, blocks(idx.size), idx, u,
                       u.dtype.type(8 * x.dtype.itemsize - 1), body["words"])
        return buf

    def _checked_words_device(self, hdr, body, dev):
        """The words with every index validated, and the ``+tau`` and ``-tau`` words."""
        from .._kernels.cuda import ops

        words = body["words"]
        bad = ops.first_bad_index(words, 1, hdr.count, dev)
        require(bad < 0, f"word at position {bad} has an out-of-range or out-of-order index")
        tau = hdr.params["tau"]
        with np.errstate(over="ignore"):  # a tau beyond float16 range decodes to ±inf
            pair = np.array([tau, -tau], dtype=hdr.dtype)
        return words, pair.view(uint_view(pair)[0].dtype)

    def _sparse_parts_device(self, hdr, body, dev):
        from .._kernels.cuda import blocks, elementwise

        words, pair = self._checked_words_device(hdr, body, dev)
        idx = dev.empty(words.size, np.int64)
        vals = dev.empty(words.size, hdr.dtype)
        if words.size:
            dev.launch(elementwise.threshold_parts, blocks(words.size), words, pair[0], pair[1], idx,
                       vals.view(pair.dtype))
        return idx, vals

    def _decode_device(self, hdr, body, dev):
        from .._kernels.cuda import blocks, elementwise

        words, pair = self._checked_words_device(hdr, body, dev)
        out = dev.zeros(hdr.count, hdr.dtype)
        if words.size:
            u, _ = uint_view(out)
            dev.launch(elementwise.threshold_decode, blocks(words.size), words, pair[0], pair[1], u)
        return out

    def _checked_words(self, hdr, body):
        """The words with every index validated, and the ±tau value of each."""
        words = body["words"]
        bad = first_bad_index(words, 1, hdr.count)
        require(bad < 0, f"word at position {bad} has an out-of-range or out-of-order index")
        tau = hdr.params["tau"]
        with np.errstate(over="ignore"):  # a tau beyond float16 range decodes to ±inf
            return words, np.where(words & 1, -tau, tau).astype(hdr.dtype)

    def _sparse_parts(self, hdr, body):
        words, vals = self._checked_words(hdr, body)
        return (words >> np.uint32(1)).astype(np.int64), vals

    def _decode(self, hdr, body):
        words, vals = self._checked_words(hdr, body)
        out = np.zeros(hdr.count, dtype=hdr.dtype)
        u, _ = uint_view(out)
        scatter(vals.view(u.dtype), (words >> np.uint32(1)).astype(np.int64), u)
        return out
