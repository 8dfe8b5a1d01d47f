"""Shared shape of the 16-bit float codecs (fp16, bf16) (private).

Body: one 16-bit word per element (section ``SECTION``), so ``2 * n`` bytes. Both are summable
element by element (:class:`compress.protocols.ElementSummable`): their representation is those
words, added in their own format. A subclass says how float input becomes words
(:meth:`Words16._words`) and what the representation looks like (:meth:`Words16._rep`); each keeps
its own decoding.
"""

from __future__ import annotations

import numpy as np

from .._backends import backend_of
from .._layout import Section
from ..base import Codec
from ..protocols import ElementSummable

__all__ = ["Words16"]


class Words16(ElementSummable, Codec):
    """Base of the codecs that send one 16-bit float word per element."""

    #: the body's section name (part of the wire format)
    SECTION = ""

    def body_nbytes(self, n, dtype):
        return 2 * n

    def _sections(self, n, dtype, params):
        return [Section(self.SECTION, np.uint16, n)]

    def _words(self, ops, x, words) -> None:
        """Round the flat float array ``x`` into ``words`` (uint16, as long)."""
        raise NotImplementedError

    def _rep(self, words):
        """The summable representation of the rounded ``words``."""
        return words

    def _widen(self, ops, words, out) -> None:
        """Widen ``words`` (uint16) into the float32 array ``out``, as long."""
        raise NotImplementedError

    def _decode(self, hdr, body, ops):
        out = ops.empty(hdr.count, np.float32)
        self._widen(ops, body[self.SECTION], out)
        return ops.astype(out, hdr.dtype)

    def _decode_into(self, hdr, body, ops, out):
        if hdr.dtype != np.float32:  # (the words widened to float32 first, then cast)
            return super()._decode_into(hdr, body, ops, out)
        self._widen(ops, body[self.SECTION], out)

    def _encode(self, x, ops, key, step, out):
        buf, body = self._new_payload(x, out, {}, ops)
        self._words(ops, x.reshape(-1), body[self.SECTION])
        return buf

    def summable_encode(self, x, *, key=None, step: int = 0) -> np.ndarray:
        ops = backend_of(x)
        x = self._prepare(x, ops).reshape(-1)
        words = ops.empty(x.size, np.uint16)
        self._words(ops, x, words)
        return self._rep(words)
