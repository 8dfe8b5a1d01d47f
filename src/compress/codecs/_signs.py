"""Shared body format of the 1-bit sign codecs (signSGD, EF-signSGD, 1-bit SGD) (private).

Body: ``ceil(n / 8)`` bytes; bit ``i`` (LSB-first) is set when ``x[i] < 0``, by value: ``-0.0`` and
``+0.0`` are the same number and both count as non-negative (so do NaN), as in GRACE (``x >= 0``,
``x < 0``) and DeepSpeed's 1-bit compression (``sign(x) + 1`` as a bool). ReLU-masked gradients hold
many ``-0.0``; splitting them off by their sign bit would send equal values differently, depending on
how each zero happened to be computed. Padding bits in the last byte must be zero. Each codec decodes
a clear bit to one value and a set bit to another, given by its header parameters.

Non-finite input propagates through those values: an infinite or NaN element makes a header value
(mean, scale) infinite or NaN, so the elements that decode to it do too (signSGD, whose values are
fixed, sends the scale NaN instead of 1). The sums behind the values are those of ``max(x, 0)`` and
``min(x, 0)`` (:func:`compress._kernels.quant.signed_sums`; a NaN reaches both). Header values are
written in canonical form (:func:`compress._util.param_value`), so device payloads keep the host's
bytes.
"""

from __future__ import annotations

import numpy as np

from .._layout import Section
from .._util import check_padding, param_value, uint_view
from ..base import Codec

__all__ = ["SignCodec"]


class SignCodec(Codec):
    """Base of 1-bit codecs; subclasses give ``_values(params) -> (non-negative, negative)``."""

    def body_nbytes(self, n, dtype):
        return (n + 7) // 8

    def _sections(self, n, dtype, params):
        return [Section("bits", np.uint8, (n + 7) // 8)]

    def _values(self, params):  # pragma: no cover - abstract
        raise NotImplementedError

    def _emit_scaled(self, x, ops, out, params_of):
        """Payload of ``x`` whose parameters come from its statistics.

        ``params_of(pos_sum, neg_sum, neg_count)`` gives the header parameters from the float64
        sums of ``max(x, 0)`` and ``min(x, 0)`` and the number of negative elements (the set bits,
        so it agrees with the payload exactly); the header is written last.
        """
        buf, bits, _ = self._emit(x, ops, out)
        pos, neg, count = ops.sign_stats(ops.float_work(x), bits)
        self._write_params(buf, x, params_of(pos, neg, count), ops)
        return buf

    def _emit(self, x, ops, out):
        """The payload (header not yet written) with the negative bits of ``x``; returns
        (payload, packed bits, number of non-finite elements)."""
        buf, body = self._new_payload(x, out, None, ops, header=False)
        u, _ = uint_view(x)
        nonfinite = ops.pack_negative_bits(u, 8 * x.dtype.itemsize - 1, body["bits"])
        return buf, body["bits"], nonfinite

    def _write_params(self, buf, x, params, ops) -> None:
        """Write the header with ``params`` in canonical form."""
        self._write_header(buf, x, {k: param_value(v) for k, v in params.items()}, ops)

    def _decode(self, hdr, body, ops):
        check_padding(ops.last_byte(body["bits"]), hdr.count)
        out = ops.empty(hdr.count, hdr.dtype)
        u, _ = uint_view(out)
        with np.errstate(over="ignore"):  # a scale beyond float16 range decodes to ±inf
            pair = np.array(self._values(hdr.params), dtype=hdr.dtype).view(u.dtype)
        ops.unpack_two_values(body["bits"], pair[0], pair[1], u)
        return out
