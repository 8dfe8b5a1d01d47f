"""Shared body format of the 1-bit sign codecs (signSGD, EF-signSGD, 1-bit SGD) (private).

Body: ``ceil(n / 8)`` bytes, bit ``i`` (LSB-first) is the IEEE sign bit of element ``i``; padding bits
in the last byte must be zero. Each codec decodes a clear bit to one value and a set bit to another,
given by its header parameters.
"""

from __future__ import annotations

import numpy as np

from .._kernels.bits import pack_sign_bits, unpack_two_values
from .._header import write_header
from .._kernels.quant import signed_sums
from .._layout import Section
from .._util import as_float_work, check_padding, require, uint_view
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

    def _emit_scaled(self, x, out, params_of):
        """Payload of ``x`` whose parameters come from its sign statistics.

        ``params_of(pos_sum, neg_sum, neg_count)`` gives the header parameters from the float64
        sums of ``max(x, 0)`` and ``min(x, 0)`` and the number of set sign bits (counted on the
        packed bits, so it agrees with the payload exactly).
        """
        pos, neg = signed_sums(as_float_work(x).reshape(-1))
        buf = self._emit(x, out, {name: 0.0 for name, _ in self.PARAMS})
        bits = buf[buf.size - self.body_nbytes(x.size, x.dtype):]
        count = int(np.bitwise_count(bits).sum())
        write_header(buf, self.codec_id, x.dtype, x.shape, self.PARAMS, params_of(pos, neg, count))
        return buf

    def _emit(self, x, out, params):
        buf, body = self._new_payload(x, out, params)
        u, _ = uint_view(x)
        pack_sign_bits(u, 8 * x.dtype.itemsize - 1, body["bits"])
        return buf

    def _emit_scaled_device(self, x, dev, out, params_of):
        """:meth:`_emit_scaled` on the device: one deterministic reduction gives both sums and the
        number of set sign bits (counted on the elements, which are the packed bits)."""
        from .._kernels.cuda import ops

        pos, neg, count = ops.signed_sums(ops.float_work(x, dev), dev)
        return self._emit_device(x, dev, out, params_of(pos, neg, count))

    def _emit_device(self, x, dev, out, params):
        from .._kernels.cuda import bits, blocks

        buf, body = self._new_payload(x, out, params, dev=dev)
        u, _ = uint_view(x)
        if body["bits"].size:
            dev.launch(bits.pack_sign_bits, blocks(body["bits"].size), u,
                       u.dtype.type(8 * x.dtype.itemsize - 1), body["bits"])
        return buf

    def _decode_device(self, hdr, body, dev):
        from .._kernels.cuda import blocks, elementwise, ops

        check_padding(np.array([ops.last_byte(body["bits"], dev)], dtype=np.uint8), hdr.count)
        out = dev.empty(hdr.count, hdr.dtype)
        u, _ = uint_view(out)
        with np.errstate(over="ignore"):  # a scale beyond float16 range decodes to ±inf
            pair = np.array(self._values(hdr.params), dtype=hdr.dtype).view(u.dtype)
        if hdr.count:
            dev.launch(elementwise.unpack_two_values, blocks(hdr.count), body["bits"], pair[0], pair[1], u)
        return out

    def _decode(self, hdr, body):
        check_padding(body["bits"], hdr.count)
        out = np.empty(hdr.count, dtype=hdr.dtype)
        u, _ = uint_view(out)
        with np.errstate(over="ignore"):  # a scale beyond float16 range decodes to ±inf
            pair = np.array(self._values(hdr.params), dtype=hdr.dtype).view(u.dtype)
        unpack_two_values(body["bits"], pair[0], pair[1], u)
        return out
