"""Shared body format of the index + value sparse codecs (top-k, DGC) (private).

Body: ``nnz`` values in the input dtype, then ``nnz`` uint32 indices, strictly increasing. Decoding
checks every index (``< n`` and strictly increasing) before scattering into a zero array.
"""

from __future__ import annotations

import numpy as np

from .._layout import Section
from .._util import require, uint_view
from ..base import Codec
from ..protocols import SparsePayload

__all__ = ["SparseCodec"]


class SparseCodec(SparsePayload, Codec):
    """Base of codecs that send ``(index, value)`` pairs."""

    PARAMS = (("nnz", "Q"),)

    def body_nbytes(self, n, dtype, nnz=None):
        """``nnz * (4 + itemsize)``; ``nnz`` defaults to what the codec sends for ``n`` elements."""
        nnz = self._default_nnz(n) if nnz is None else int(nnz)
        return nnz * (4 + np.dtype(dtype).itemsize)

    def _default_nnz(self, n):  # pragma: no cover - overridden where the size is fixed
        raise TypeError(f"the payload size of {self.name!r} depends on the data: pass nnz=")

    def _sections(self, n, dtype, params):
        k = params["nnz"]
        return [Section("values", dtype, k), Section("indices", np.uint32, k)]

    def _check_params(self, hdr):
        require(hdr.params["nnz"] <= hdr.count, f"nnz {hdr.params['nnz']} exceeds the element count {hdr.count}")
        require(hdr.count < 1 << 32, f"sparse payloads hold at most 2**32 - 1 elements, not {hdr.count}")

    def _prepare(self, x, ops):
        x = super()._prepare(x, ops)
        require(x.size < 1 << 32, f"sparse codecs take at most 2**32 - 1 elements, not {x.size}")
        return x

    def _emit(self, x, ops, out, idx):
        """Payload holding ``x[idx]`` for ascending int64 indices ``idx`` (of the backend ``ops``)."""
        return self._emit_sent(x, ops, out, idx)[0]

    def _emit_sent(self, x, ops, out, idx, bits=None):
        """``(payload, idx, values)``: :meth:`_emit`'s payload, the indices and the values it
        sends (a view of its body; the decoder writes them at ``idx``). ``bits``: the values'
        bits, when the caller has them (else they are read from ``x``)."""
        buf, body = self._new_payload(x, out, {"nnz": idx.size}, ops)
        u, _ = uint_view(x)
        if bits is None:
            ops.gather(u, idx, body["values"].view(u.dtype))
        else:
            ops.copy_into(body["values"].view(u.dtype), bits)
        ops.cast_into(idx, body["indices"])
        return buf, idx, body["values"]

    def _check_indices(self, hdr, body, ops):
        idx = body["indices"]
        bad = ops.first_bad_index(idx, 0, hdr.count)
        if bad >= 0:
            value = int(ops.to_host(idx[bad:bad + 1])[0])
            raise ValueError(f"index {value} at position {bad} is out of range or out of order")
        return idx

    def _sparse_parts(self, hdr, body, ops):
        return ops.cast_copy(self._check_indices(hdr, body, ops), np.int64), ops.copy(body["values"])

    def _sparse_views(self, hdr, body, ops):
        return self._check_indices(hdr, body, ops), body["values"]

    def _decode(self, hdr, body, ops):
        idx = self._check_indices(hdr, body, ops)
        out = ops.zeros(hdr.count, hdr.dtype)
        u, _ = uint_view(out)
        ops.scatter(body["values"].view(u.dtype), idx, u)
        return out
