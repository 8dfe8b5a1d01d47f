"""Shared body format of the index + value sparse codecs (top-k, DGC) (private).

Body: ``nnz`` values in the input dtype, then ``nnz`` uint32 indices, strictly increasing. Decoding
checks every index (``< n`` and strictly increasing) before scattering into a zero array.
"""

from __future__ import annotations

import numpy as np

from .._kernels.sparse import first_bad_index, gather, scatter
from .._layout import Section
from .._util import require, uint_view
from ..base import Codec

__all__ = ["SparseCodec"]


class SparseCodec(Codec):
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

    def _prepare(self, x):
        x = super()._prepare(x)
        require(x.size < 1 << 32, f"sparse codecs take at most 2**32 - 1 elements, not {x.size}")
        return x

    def _emit(self, x, out, idx):
        """Payload holding ``x[idx]`` for ascending int64 indices ``idx``."""
        buf, body = self._new_payload(x, out, {"nnz": idx.size})
        u, _ = uint_view(x)
        gather(u, idx, body["values"].view(u.dtype))
        body["indices"][:] = idx
        return buf

    def _emit_device(self, x, dev, out, idx):
        """:meth:`_emit` on the device, ``idx`` a device int64 array."""
        from .._kernels.cuda import blocks, elementwise

        buf, body = self._new_payload(x, out, {"nnz": idx.size}, dev=dev)
        if idx.size:
            u, _ = uint_view(x)
            dev.launch(elementwise.gather, blocks(idx.size), u, idx, body["values"].view(u.dtype))
            dev.launch(elementwise.gather_all, blocks(idx.size), idx, body["indices"])
        return buf

    def _check_indices_device(self, hdr, body, dev):
        from .._kernels.cuda import ops

        idx = body["indices"]
        bad = ops.first_bad_index(idx, 0, hdr.count, dev)
        if bad >= 0:
            value = int(dev.to_host(idx[bad:bad + 1])[0])
            raise ValueError(f"index {value} at position {bad} is out of range or out of order")
        return idx

    def _sparse_parts_device(self, hdr, body, dev):
        from .._kernels.cuda import ops

        idx = self._check_indices_device(hdr, body, dev)
        return ops.cast_copy(idx, np.int64, dev), dev.copy(body["values"])

    def _decode_device(self, hdr, body, dev):
        from .._kernels.cuda import blocks, elementwise

        idx = self._check_indices_device(hdr, body, dev)
        out = dev.zeros(hdr.count, hdr.dtype)
        if idx.size:
            u, _ = uint_view(out)
            dev.launch(elementwise.scatter, blocks(idx.size), body["values"].view(u.dtype), idx, u)
        return out

    def _check_indices(self, hdr, body):
        idx = body["indices"]
        bad = first_bad_index(idx, 0, hdr.count)
        require(bad < 0, f"index {int(idx[bad]) if bad >= 0 else 0} at position {bad} is out of range or out of order")
        return idx

    def _sparse_parts(self, hdr, body):
        return self._check_indices(hdr, body).astype(np.int64), body["values"].copy()

    def _decode(self, hdr, body):
        idx = self._check_indices(hdr, body)
        out = np.zeros(hdr.count, dtype=hdr.dtype)
        values = body["values"]
        u, _ = uint_view(out)
        scatter(values.view(u.dtype), idx, u)
        return out
