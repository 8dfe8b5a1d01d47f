"""What a codec can do, declared in code: the protocols collectives dispatch on.

A codec says what a collective may do with it by subclassing these abstract classes (next to
:class:`compress.Codec`), not by having methods a caller probes for:

:class:`ElementSummable`
    Its representation adds element-wise: ``summable_encode`` gives it as one 1-D array,
    ``summable_add(a, b, out=)`` adds two (a NumPy ufunc, or a function with that calling
    convention: bf16 adds on raw words), ``summable_decode`` turns a (summed) representation back
    into a dense array. A compressed allreduce sums it with one dense allreduce (none, fp16, bf16,
    randomk).
:class:`LowRankSummable`
    A rank-r factorisation whose factors add (PowerSGD): ``compute_p``, summed; ``orthogonalize``;
    ``compute_q``, summed; ``reconstruct``. ``compresses(shape, dtype)`` says which tensors it
    factors; the others travel uncompressed (a plain dense allreduce of the values).
:class:`SparsePayload`
    Payloads are (index, value) lists (``Codec.sparse_parts`` returns them validated), so a sparse
    allreduce can merge them without decoding (topk, threshold, dgc).
:class:`FusedFeedback`
    It encodes the tensor a memory computes (error feedback's ``x + e``, DGC's momentum-corrected
    velocity) in the pass that computes it: given a *source* (the inputs and the buffer that
    becomes the memory's new state) instead of the finished tensor, it gathers its selection's
    statistics while the tensor is written, and says which elements it sent and what the decoder
    makes of them, so the memory updates its state there without decoding the payload (topk,
    dgc, threshold, randomk). :class:`compress.ErrorFeedback` and :class:`compress.DGCMemory`
    take that path for host arrays, and the generic one (compute, encode, decode) otherwise;
    both give the same bits.
:class:`Memory`
    A compensation memory around a codec (error feedback, DGC's momentum correction): it encodes
    with per-tensor state, which ``state_dict`` / ``load_state_dict`` save and restore.

A codec's ``summable`` and ``sparse`` properties follow from these (``Codec`` sets them when the
class is made, and refuses a class that claims one without the protocol).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

__all__ = ["ElementSummable", "LowRankSummable", "SparsePayload", "FusedFeedback", "Memory",
           "SUMMABLE", "decoded_into", "writes_into"]


class ElementSummable(ABC):
    """A codec whose representation an allreduce can add element by element."""

    @abstractmethod
    def summable_encode(self, x, *, key=None, step: int = 0):
        """The representation of ``x`` as one 1-D array (host or CuPy, where ``x`` is)."""

    @staticmethod
    @abstractmethod
    def summable_add(a, b, out) -> None:
        """``out = a + b`` for two representations (NumPy's ufunc calling convention)."""

    @abstractmethod
    def summable_decode(self, rep, *, shape, dtype, key=None, step: int = 0, out=None):
        """A dense array of ``shape`` and ``dtype`` from a (summed) representation; with
        ``out`` (an array of that many elements and ``dtype``, where ``rep`` is), written there
        and returned in ``shape`` (:func:`decoded_into`)."""


def decoded_into(result, out, shape):
    """``result`` (a decoded array), or, with ``out``, ``result`` copied into ``out`` and
    ``out`` returned in ``shape``: what a ``summable_decode`` returns where it cannot write
    into ``out`` directly."""
    if out is None:
        return result
    out[...] = result.reshape(out.shape)
    return out.reshape(shape)


def writes_into(out, dtype) -> bool:
    """Whether a decode kernel may write into ``out`` directly: given, contiguous, of
    ``dtype``."""
    return out is not None and out.flags.c_contiguous and out.dtype == dtype


class LowRankSummable(ABC):
    """A codec that sends low-rank factors, each of which an allreduce can add (PowerSGD)."""

    @abstractmethod
    def compresses(self, shape, dtype) -> bool:
        """Whether a tensor of ``shape`` and ``dtype`` is sent as factors; one that is not is
        sent as it is (1-d tensors, matrices too small to gain)."""

    @abstractmethod
    def compute_p(self, x, *, key=None):
        """``P = M Q`` of this rank's tensor (rows x r): sum it over ranks."""

    @staticmethod
    @abstractmethod
    def orthogonalize(p):
        """An orthonormal basis of the columns of the summed ``P``."""

    @abstractmethod
    def compute_q(self, x, p_hat):
        """``Q = M^T P_hat`` (cols x r): sum it over ranks."""

    @abstractmethod
    def reconstruct(self, p_hat, q, *, key=None, shape=None, dtype=None, out=None):
        """``P_hat Q^T`` in ``shape``; keeps what the next step starts from. ``out``: a
        contiguous array of the result's size that it may be written into (the result is then
        ``out`` reshaped; an implementation may ignore it and return a new array)."""


#: The protocols that make a codec ``summable``.
SUMMABLE = (ElementSummable, LowRankSummable)


class SparsePayload(ABC):
    """A codec whose payloads are sorted (index, value) lists."""

    @abstractmethod
    def _sparse_parts(self, hdr, body, ops):
        """(strictly increasing int64 indices, values) of a validated payload (see
        ``Codec.sparse_parts``)."""

    def _sparse_views(self, hdr, body, ops):
        """(strictly increasing uint32 indices, values) of a validated payload, views of it
        where it holds them so (see ``Codec.sparse_views``); here: :meth:`_sparse_parts`
        with its indices cast."""
        idx, vals = self._sparse_parts(hdr, body, ops)
        return ops.cast_copy(idx, np.uint32), vals


class FusedFeedback(ABC):
    """A codec that encodes a memory's tensor in the pass that computes it (host arrays)."""

    #: True when its decoder writes the tensor's own values at the sent indices (top-k, DGC):
    #: error feedback's new residual is then zero there, written without a subtraction.
    sends_values: bool = False

    @abstractmethod
    def _encode_source(self, src, key, step: int, out):
        """``(payload, idx, sent)`` of the tensor the host source ``src``
        (``compress._kernels.sources``) computes into ``src.tensor`` (it runs the source once):
        the payload ``encode(src.tensor, key=key, step=step, out=out)`` would give, the ascending
        int64 indices it sends, and what its decoder writes there (in the tensor's dtype; zero
        elsewhere)."""


class Memory(ABC):
    """A compensation memory around a codec: ``encode`` adds what earlier steps held back.

    ``codec`` is the codec it wraps; ``state`` its per-tensor state, a dict by key. ``decode``
    (the codec's) and ``reset`` come with the protocol.
    """

    codec: object
    state: dict

    @abstractmethod
    def encode(self, x, *, key=None, step: int = 0):
        """The payload of ``x`` corrected by the state of ``key``; updates that state."""

    def decode(self, payload, *, count: int | None = None, max_elements: int | None = None,
               out=None):
        """Decode with the wrapped codec (``count``, ``max_elements``, ``out``: see
        ``Codec.decode``)."""
        return self.codec.decode(payload, count=count, max_elements=max_elements, out=out)

    def flush(self, x, *, key=None):
        """What a dense step sends for ``x`` in place of a payload (what the state of ``key``
        holds back, added), emptying that state; memories that cannot raise TypeError."""
        raise TypeError(f"{type(self).__name__} cannot hand its state to a dense step")

    def reset(self, key=None) -> None:
        """Forget the state of ``key`` (of every key when None)."""
        if key is None:
            self.state.clear()
        else:
            self.state.pop(key, None)

    @abstractmethod
    def state_dict(self) -> dict[str, np.ndarray]:
        """The state of every key as named host arrays (for a checkpoint)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Replace all state by what :meth:`state_dict` returned."""
