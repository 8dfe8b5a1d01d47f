"""The codec interface shared by every compressor.

A codec turns a float array into one self-describing ``np.uint8`` payload and back::

    payload = codec.encode(x, key="layer1.weight", step=3)
    y = codec.decode(payload)          # same shape and dtype as x

Subclasses describe their body as typed sections (:mod:`compress._layout`) and implement
``_encode`` / ``_decode``; this base class owns everything common: input checks, header writing and
validation (:mod:`compress.header`), the exact-length check and the size formula. Codecs declare what
a collective may do with them as class attributes:

``summable``
    Payload bodies (or the representation the codec exposes for it) may be added element-wise by a
    plain allreduce and still decode to the sum: the codec subclasses a summable protocol
    (:class:`compress.protocols.ElementSummable` or :class:`~compress.protocols.LowRankSummable`),
    and this property follows from that.
``unbiased``
    ``E[decode(encode(x))] == x`` over the codec's randomness.
``needs_error_feedback``
    Without error feedback (:class:`compress.ErrorFeedback`) training with this codec is known to
    stall or diverge.
``aggregation``
    How decoded contributions of several workers are combined: ``"mean"`` (average), ``"sum"``, or
    ``"majority"`` (element-wise sign of the sum, signSGD's vote).
``sparse``
    Payloads are (index, value) lists, so a sparse allreduce (SparCML) can merge them: the codec
    subclasses :class:`compress.protocols.SparsePayload`, and this property follows from that.
``randomness``
    ``None`` (deterministic), ``"private"`` (its own noise: give every rank a different ``seed``)
    or ``"shared"`` (drawn from ``(seed, key, step)``: give every rank the same ``seed``).

Codecs with state (PowerSGD's warm start, the generator of private randomness) give it as named
host arrays by ``state_dict()`` and take it back by ``load_state_dict()``.

Input handling: dtypes outside ``dtypes`` raise ``TypeError`` naming the valid ones; non-contiguous
input is copied to a contiguous array first (never rejected).

Device arrays: ``encode``, ``decode`` and ``sparse_parts`` given a CUDA device array run on the
device and return device arrays; payload bytes are the host's. The hooks ``_encode`` / ``_decode`` /
``_sparse_parts`` are written once, against a kernel backend ``ops`` (:mod:`compress._backends`):
the host's Numba kernels or the device's CUDA kernels, with the same names.
"""

from __future__ import annotations

import json
from math import prod
from typing import ClassVar, Sequence

import numpy as np

from ._backends import backend_of
from .header import MAX_COUNT, MAX_NDIM, Header, header_nbytes, read_header, write_header
from ._layout import Section, body_nbytes, split_body
from ._util import quiet
from .arrays import as_array, like
from .protocols import SUMMABLE, SparsePayload

__all__ = ["Codec", "FLOAT_DTYPES", "DECODE_MAX_ELEMENTS"]

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

#: The most elements :meth:`Codec.decode` and :meth:`Codec.sparse_parts` accept from a payload's
#: header when the caller does not say how many it expects (``count=``): 2**28 (1 GiB of
#: float32). Sparse and low-rank payloads are small whatever the count they claim, so without a
#: limit a payload of a few hundred bytes could ask for a dense array of up to ``MAX_COUNT``
#: (2**40) elements. ``max_elements=`` raises (or lowers) it for one call.
DECODE_MAX_ELEMENTS = 1 << 28


class Codec:
    """Base class of all codecs; see the module docstring."""

    name: ClassVar[str] = ""
    codec_id: ClassVar[int] = 0
    summable: ClassVar[bool] = False   # set from the protocols (see __init_subclass__)
    unbiased: ClassVar[bool] = False
    needs_error_feedback: ClassVar[bool] = False
    aggregation: ClassVar[str] = "mean"
    sparse: ClassVar[bool] = False     # set from the protocols (see __init_subclass__)
    randomness: ClassVar[str | None] = None
    dtypes: ClassVar[tuple[np.dtype, ...]] = FLOAT_DTYPES
    #: header parameters: (name, struct kind) with kind "Q" (uint64) or "d" (float64)
    PARAMS: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: the generator of codecs with private randomness (set by those codecs from ``seed``)
    _rng: np.random.Generator | None = None

    def __init_subclass__(cls, **kwargs):
        """Derive ``summable`` and ``sparse`` from the protocols the class subclasses."""
        super().__init_subclass__(**kwargs)
        for flag, protocols in (("summable", SUMMABLE), ("sparse", (SparsePayload,))):
            speaks = issubclass(cls, protocols)
            if flag in cls.__dict__ and bool(cls.__dict__[flag]) != speaks:
                names = " or ".join(p.__name__ for p in protocols)
                raise TypeError(f"{cls.__name__}: {flag} = {cls.__dict__[flag]} but the class "
                                f"{'subclasses' if speaks else 'does not subclass'} {names}")
            setattr(cls, flag, speaks)

    # ------------------------------------------------------------------ public API
    def encode(self, x, *, key=None, step: int = 0, out=None) -> np.ndarray:
        """Compress ``x`` into one contiguous uint8 payload.

        Parameters
        ----------
        x : array_like or device array
            Float array of a dtype in ``self.dtypes``; copied first if not C-contiguous. A CUDA
            device array (CuPy, Numba) is encoded on its device, into a device payload with the
            same bytes (:mod:`compress._backends.cuda`). A PyTorch tensor (or another ``__dlpack__``
            exporter) is read zero-copy (:func:`compress.arrays.as_array`) and its payload is a
            uint8 tensor on its device.
        key : None, int, str or bytes
            Tensor identity. Codecs with shared randomness (random-k) and per-tensor state
            (PowerSGD, error feedback) use it; others ignore it.
        step : int
            Training step; shared-randomness codecs draw fresh indices per step.
        out : numpy.ndarray or device array, optional
            A contiguous uint8 array, where ``x`` lives, of exactly the payload's size
            (:meth:`payload_nbytes`) to write the payload into, and return: a training loop can
            reuse one buffer per tensor instead of allocating (and page-faulting) a new one every
            step.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        a = as_array(x)
        ops = backend_of(a)
        payload = self._encode(self._prepare(a, ops), ops, key, int(step),
                               None if out is None else as_array(out))
        return like(x, payload) if out is None else out

    def decode(self, payload, *, count: int | None = None,
               max_elements: int | None = None, out=None) -> np.ndarray:
        """Decompress a payload of this codec into a new dense array (or into ``out``).

        Parameters
        ----------
        count : int, optional
            The number of elements the caller expects. A payload from elsewhere (another rank)
            whose header claims a different count is rejected before anything is allocated.
        max_elements : int, optional
            The most elements the header may claim; default ``count`` when given, else
            :data:`DECODE_MAX_ELEMENTS` (2**28). Pass a larger value (up to ``MAX_COUNT``,
            2**40) to decode larger tensors without naming their exact count. So a hostile
            header cannot make the decoder allocate gigabytes: a sparse or low-rank payload of
            a few hundred bytes may claim billions of elements. (Dense formats need a payload
            proportional to the count anyway: the exact-length check bounds them.)
        out : numpy.ndarray or device array, optional
            A C-contiguous, writeable array of the payload's dtype and element count (any
            shape), where the payload lives, to decode into and return (in the payload's
            shape): a collective that decodes into its result saves a new array and a copy
            each call. The fp16 and bf16 codecs write into it directly; the others decode and
            copy.

        Raises
        ------
        ValueError
            If the payload is truncated, padded, corrupted, from another codec or otherwise
            malformed, holds other than ``count`` elements or more than ``max_elements``.
            Validation finishes before anything of the payload's size is allocated and before
            any index is used to write.
        """
        buf = as_array(payload)
        ops = backend_of(buf)
        hdr, body = self._parse(buf, count, max_elements, ops)
        if out is None:
            return like(payload, self._decode(hdr, body, ops).reshape(hdr.shape))
        dst = as_array(out)
        if (dst.size != hdr.count or dst.dtype != hdr.dtype or not dst.flags.c_contiguous
                or not getattr(dst.flags, "writeable", True)  # (CuPy's flags have none)
                or type(backend_of(dst)) is not type(ops)):
            raise ValueError(f"out must be a writeable C-contiguous {hdr.dtype} array of "
                             f"{hdr.count} elements where the payload lives, got "
                             f"{dst.dtype} of {dst.size} elements")
        self._decode_into(hdr, body, ops, dst.reshape(-1))
        return out.reshape(hdr.shape)

    def _decode_into(self, hdr: Header, body: dict, ops, out) -> None:
        """Decode into the flat array ``out`` (checked: the payload's dtype and count); by
        default a new array, copied."""
        out[...] = self._decode(hdr, body, ops).reshape(-1)

    def sparse_parts(self, payload, *, count: int | None = None,
                     max_elements: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """For ``sparse`` codecs: the payload as (strictly increasing int64 flat indices, values).

        Validated like :meth:`decode` (every index in range and in order, ``count`` and
        ``max_elements`` checked the same way) before anything is returned, so a sparse
        allreduce can merge the lists without decoding to dense.
        """
        return self._sparse(payload, count, max_elements, "_sparse_parts")

    def sparse_views(self, payload, *, count: int | None = None,
                     max_elements: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`sparse_parts` without copies where the format allows: the validated
        (strictly increasing uint32 flat indices, values), views of the payload where it holds
        them as such (top-k, DGC: valid while the payload is; not to be written)."""
        return self._sparse(payload, count, max_elements, "_sparse_views")

    def _sparse(self, payload, count, max_elements, method: str):
        """The validated lists of a sparse codec's payload, by the protocol's ``method``."""
        if not isinstance(self, SparsePayload):
            raise TypeError(f"codec {self.name!r} is not sparse")
        buf = as_array(payload)
        ops = backend_of(buf)
        return getattr(self, method)(*self._parse(buf, count, max_elements, ops), ops)

    def _parse(self, payload, count: int | None, max_elements: int | None,
               ops) -> tuple[Header, dict[str, np.ndarray]]:
        """Validate the header, the parameters, the element count (against ``count`` and the
        limit) and the exact length; return the body sections. Of a device payload only the
        header travels to the host, so both backends share every check."""
        limit = _element_limit(count, max_elements)
        buf = ops.as_payload(payload)
        prefix = ops.header_prefix(buf, header_nbytes(MAX_NDIM, len(self.PARAMS)))
        hdr = read_header(prefix, self.codec_id, self.PARAMS)
        if count is not None and hdr.count != count:
            raise ValueError(f"payload holds {hdr.count} elements, expected {count}")
        if hdr.count > limit:
            raise ValueError(f"payload claims {hdr.count} elements, more than max_elements="
                             f"{limit}; pass count= or a larger max_elements= to decode it")
        self._check_params(hdr)
        sections = self._sections(hdr.count, hdr.dtype, hdr.params)
        expected = hdr.nbytes + body_nbytes(sections)
        if buf.size != expected:
            raise ValueError(f"payload has {buf.size} bytes, its header implies exactly {expected}")
        return hdr, split_body(buf, hdr.nbytes, sections)

    def payload_nbytes(self, shape, dtype=np.float32, **data) -> int:
        """Exact payload size for an input of ``shape`` (an int means 1-D) and ``dtype``.

        Codecs whose size depends on the data (threshold, DGC) take the number of sent elements as
        ``nnz=``.
        """
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
        dtype = self._check_dtype(dtype)
        return header_nbytes(len(shape), len(self.PARAMS)) + self.body_nbytes(prod(shape), dtype, **data)

    def body_nbytes(self, n: int, dtype, **data) -> int:  # pragma: no cover - abstract
        """Exact body size in bytes for ``n`` elements (the formula in the codec's docstring)."""
        raise NotImplementedError

    def recompressor(self) -> "Codec":
        """The codec that compresses an aggregate of this codec's decoded payloads once more (the
        server of a two-phase allreduce): the codec itself, except where decoding scaled values
        that a second encoding at the same randomness would scale again (random-k with
        ``unbiased_scaling``). Its payloads decode with this codec."""
        return self

    def aggregate(self, decoded: Sequence[np.ndarray]) -> np.ndarray:
        """Combine decoded arrays of several workers according to ``aggregation``."""
        if not decoded:
            raise ValueError("aggregate needs at least one array")
        with quiet():  # an overflowed contribution's inf or NaN propagates, without warnings
            total = np.sum(np.stack([np.asarray(d, dtype=np.float64) for d in decoded]), axis=0)
            if self.aggregation == "mean":
                total /= len(decoded)
            elif self.aggregation == "majority":
                total = np.sign(total)
            return total.astype(decoded[0].dtype)

    @property
    def generator(self) -> np.random.Generator | None:
        """The generator of a codec with private randomness (``seed`` made it), else None."""
        return self._rng

    def state_dict(self) -> dict[str, np.ndarray]:
        """The codec's own state as named host arrays, for a checkpoint: the state of the private
        generator (codecs with ``randomness = "private"``), nothing for the others."""
        if self._rng is None:
            return {}
        return {"rng": np.array(json.dumps(self._rng.bit_generator.state))}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if self._rng is not None and "rng" in state:
            self._rng.bit_generator.state = json.loads(str(state["rng"]))

    # ------------------------------------------------------------------ subclass hooks
    def _sections(self, n: int, dtype: np.dtype, params: dict) -> list[Section]:  # pragma: no cover
        raise NotImplementedError

    # ``ops`` is the kernel backend of the arrays (compress._backends): the host's or a device's
    def _encode(self, x, ops, key, step: int, out):  # pragma: no cover
        """The payload of the prepared (contiguous, checked) ``x``."""
        raise NotImplementedError

    def _decode(self, hdr: Header, body: dict, ops):  # pragma: no cover
        """The flat dense contents of a validated payload."""
        raise NotImplementedError

    def _check_params(self, hdr: Header) -> None:
        """Raise ``ValueError`` when header parameters are impossible (default: nothing to check)."""

    # ------------------------------------------------------------------ helpers for subclasses
    def _new_payload(self, x, out, params: dict, ops, header: bool = True):
        """A payload for ``x`` (``out`` if given, checked, else new) of the backend ``ops``, with its
        header written (unless ``header`` is False: then :meth:`_write_header` later, for headers
        whose parameters come from the body); return ``(payload, body views)``."""
        sections = self._sections(x.size, x.dtype, params)
        hlen = header_nbytes(x.ndim, len(self.PARAMS))
        nbytes = hlen + body_nbytes(sections)
        if out is None:
            buf = ops.empty(nbytes, np.uint8)
        elif not ops.usable_out(out, nbytes):
            raise ValueError(f"out must be a writeable contiguous 1-D uint8 {ops.where} array of "
                             f"exactly {nbytes} bytes (payload_nbytes)")
        else:
            buf = out
        if header:
            self._write_header(buf, x, params, ops)
        return buf, split_body(buf, hlen, sections)

    def _write_header(self, buf, x, params: dict, ops) -> None:
        """Write the header of ``x``'s payload ``buf`` (a device header is made on the host)."""
        if ops.host:
            write_header(buf, self.codec_id, x.dtype, x.shape, self.PARAMS, params)
            return
        head = np.empty(header_nbytes(x.ndim, len(self.PARAMS)), dtype=np.uint8)
        write_header(head, self.codec_id, x.dtype, x.shape, self.PARAMS, params)
        ops.write(buf[:head.size], head)

    def _check_dtype(self, dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        if dtype not in self.dtypes:
            valid = ", ".join(str(d) for d in self.dtypes)
            raise TypeError(f"codec {self.name!r} does not support dtype {dtype}; valid dtypes: {valid}")
        return dtype

    def _prepare(self, x, ops):
        """``x`` as a checked, C-contiguous array of the backend ``ops`` (copied if needed)."""
        x = ops.wrap(x)
        self._check_array(x)
        return ops.contiguous(x)

    def _prepare_any(self, x):
        """:meth:`_prepare` with the backend of ``x``, for protocols that take host or device input."""
        return self._prepare(x, backend_of(x))

    def _check_array(self, x) -> None:
        self._check_dtype(x.dtype)
        if x.ndim > MAX_NDIM:
            raise ValueError(f"arrays of more than {MAX_NDIM} dimensions are not supported (got {x.ndim})")


def _element_limit(count, max_elements) -> int:
    """The most elements a header may claim in one decode (see :meth:`Codec.decode`)."""
    for name, value in (("count", count), ("max_elements", max_elements)):
        if value is not None and (not isinstance(value, (int, np.integer))
                                  or isinstance(value, bool) or value < 0):
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if max_elements is not None:
        return min(int(max_elements), MAX_COUNT)
    return int(count) if count is not None else DECODE_MAX_ELEMENTS
