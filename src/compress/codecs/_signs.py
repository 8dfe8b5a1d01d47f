"""Shared body format of the 1-bit sign codecs (signSGD, EF-signSGD, 1-bit SGD) (private).

Body: ``ceil(n / 8)`` bytes, bit ``i`` (LSB-first) is the IEEE sign bit of element ``i``; padding bits
in the last byte must be zero. Each codec decodes a clear bit to one value and a set bit to another,
given by its header parameters.
"""

from __future__ import annotations

import numpy as np

from .._layout import Section
from .._util import check_padding, require, uint_view
from ..base import Codec

__all__ = ["SignCodec"]


class SignCodec(Codec):
    """Base of 1-bit codecs; subclasses give ``_values(params) -> (pos, neg)``."""

    def body_nbytes(self, n, dtype):
        return (n + 7) // 8

    def _sections(self, n, dtype, params):
        return [Section("bits", np.uint8, (n + 7) // 8)]

    def _values(self, params):  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_params(self, hdr):
        for name, value in hdr.params.items():
            require(np.isfinite(value), f"parameter {name} = {value} is not finite")

    def _emit_scaled(self, x, ops, out, params_of):
        """Payload of ``x`` whose parameters come from its sign statistics.

        ``params_of(pos_sum, neg_sum, neg_count)`` gives the header parameters from the float64
        sums of ``max(x, 0)`` and ``min(x, 0)`` and the number of set sign bits (equal to the
        packed bits, so it agrees with the payload exactly); the header is written last.
        """
        buf, bits = self._emit(x, ops, out, None)
        pos, neg, count = ops.sign_stats(ops.float_work(x), bits)
        self._write_header(buf, x, params_of(pos, neg, count), ops)
        return buf

    def _emit(self, x, ops, out, params):
        """The payload with the sign bits of ``x`` (and its header unless ``params`` is None);
        returns (payload, packed bits)."""
        buf, body = self._new_payload(x, out, params, ops, header=params is not None)
        u, _ = uint_view(x)
        ops.pack_sign_bits(u, 8 * x.dtype.itemsize - 1, body["bits"])
        return buf, body["bits"]

    def _decode(self, hdr, body, ops):
        check_padding(ops.last_byte(body["bits"]), hdr.count)
        out = ops.empty(hdr.count, hdr.dtype)
        u, _ = uint_view(out)
        with np.errstate(over="ignore"):  # a scale beyond float16 range decodes to ±inf
            pair = np.array(self._values(hdr.params), dtype=hdr.dtype).view(u.dtype)
        ops.unpack_two_values(body["bits"], pair[0], pair[1], u)
        return out
