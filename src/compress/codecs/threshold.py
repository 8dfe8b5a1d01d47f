"""Threshold quantization (Strom 2015): send index and sign of entries with ``|x| >= tau``.

How it works: every element whose magnitude reaches the fixed threshold ``tau`` is sent as one 32-bit
word ``index << 1 | sign``, and decodes to ``±tau``; everything else decodes to zero. The difference
stays in the residual, so it must be used with error feedback (:class:`compress.ErrorFeedback`).
Strom, "Scalable Distributed DNN Training Using Commodity GPU Cloud Computing", Interspeech 2015.
The number of words is data dependent (``nnz``) and is in the header. With error feedback the pass
that computes ``x + e`` collects the sent indices (:class:`compress.protocols.FusedFeedback`).

Non-finite input: ``±inf`` and NaN pass every threshold (their magnitude keys sort above all finite
ones), so they are always sent; a word says only a sign, so such a payload has ``tau = NaN`` in its
header and every sent element decodes to NaN.

Wire size: ``header + 4 * nnz`` bytes, ``header = 16 + 8 * ndim + 16`` (nnz and tau). Inputs are
limited to ``2**31 - 1`` elements (31-bit indices).

Properties: not summable, biased, needs error feedback, aggregation "mean".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._backends import HOST
from .._layout import Section
from .._util import inf_word, require, uint_view
from ..base import Codec
from ..protocols import FusedFeedback, SparsePayload

__all__ = ["Threshold"]


@dataclass(eq=False)
class Threshold(FusedFeedback, SparsePayload, Codec):
    """Strom's threshold quantization.

    Parameters
    ----------
    tau : float
        Threshold, > 0. Elements with ``|x| >= tau`` are sent as ``±tau``.
    """

    tau: float = 1e-3

    name = "threshold"
    codec_id = 6
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
        require(np.isnan(p["tau"]) or (np.isfinite(p["tau"]) and p["tau"] > 0),
                f"tau {p['tau']} must be finite and > 0, or NaN (non-finite input)")

    def _encode(self, x, ops, key, step, out):
        require(x.size < 1 << 31, f"threshold takes at most 2**31 - 1 elements, not {x.size}")
        u, absmask = uint_view(x)
        idx = ops.collect_at_least(u, absmask, self._key(x.dtype))
        nonfinite = False
        if idx.size:  # every non-finite element is among the selected ones
            keys = ops.empty(idx.size, u.dtype)
            ops.gather(u, idx, keys)
            nonfinite = bool(ops.count_at_least(keys, absmask, inf_word(x.dtype)))
        return self._emit(x, ops, out, idx, nonfinite)[0]

    def _encode_source(self, src, key, step, out):
        """The collecting pass is the one that computes the tensor; its capacity comes from the
        share of a strided sample that passes (a second pass collects when that was short)."""
        n = src.size
        require(n < 1 << 31, f"threshold takes at most 2**31 - 1 elements, not {n}")
        thr = self._key(src.dtype)
        probe = src.keys_at(np.arange(0, n, max(1, n // 4096), dtype=np.int64))
        share = float(np.count_nonzero(probe >= thr)) / max(1, probe.size)
        scan = src.run(thr, int(2 * share * n) + 1024)
        idx = scan.cand if scan.complete else \
            HOST.collect_at_least(src.bits, src.absmask, thr, scan.count)
        buf, words, tau = self._emit(src.tensor, HOST, out, idx, src.nonfinite)
        with np.errstate(over="ignore"):  # a tau beyond float16 range decodes to ±inf
            pair = np.array([tau, -tau], dtype=src.dtype)
        return buf, idx, pair[words & 1]

    def _key(self, dtype):
        """The magnitude key of ``tau`` in ``dtype``: elements whose key reaches it are sent."""
        t = np.array(self.tau, dtype=dtype)
        return t.view(uint_view(t)[0].dtype)[()]

    def _emit(self, x, ops, out, idx, nonfinite: bool):
        """``(payload, words, tau)`` of the ascending indices ``idx`` of ``x``; the header's tau is
        NaN when ``x`` holds inf or NaN (all of which are in ``idx``)."""
        tau = float("nan") if nonfinite else float(self.tau)
        buf, body = self._new_payload(x, out, {"nnz": idx.size, "tau": tau}, ops)
        u, _ = uint_view(x)
        ops.threshold_words(idx, u, 8 * x.dtype.itemsize - 1, body["words"])
        return buf, body["words"], tau

    def _checked_words(self, hdr, body, ops):
        """The words with every index validated, and the bit patterns of ``+tau`` and ``-tau``."""
        words = body["words"]
        bad = ops.first_bad_index(words, 1, hdr.count)
        require(bad < 0, f"word at position {bad} has an out-of-range or out-of-order index")
        tau = hdr.params["tau"]
        with np.errstate(over="ignore"):  # a tau beyond float16 range decodes to ±inf
            pair = np.array([tau, -tau], dtype=hdr.dtype)
        return words, pair.view(uint_view(pair)[0].dtype)

    def _sparse_parts(self, hdr, body, ops):
        return ops.threshold_parts(*self._checked_words(hdr, body, ops))

    def _decode(self, hdr, body, ops):
        words, pair = self._checked_words(hdr, body, ops)
        out = ops.zeros(hdr.count, hdr.dtype)
        ops.threshold_decode(words, pair, uint_view(out)[0])
        return out
