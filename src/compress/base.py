"""The codec interface shared by every compressor.

A codec turns a float array into one self-describing ``np.uint8`` payload and back::

    payload = codec.encode(x, key="layer1.weight", step=3)
    y = codec.decode(payload)          # same shape and dtype as x

Subclasses describe their body as typed sections (:mod:`compress._layout`) and implement
``_encode`` / ``_decode``; this base class owns everything common: input checks, header writing and
validation (:mod:`compress._header`), the exact-length check and the size formula. Codecs declare what
a collective may do with them as class attributes:

``summable``
    Payload bodies (or the representation the codec exposes for it) may be added element-wise by a
    plain allreduce and still decode to the sum.
``unbiased``
    ``E[decode(encode(x))] == x`` over the codec's randomness.
``needs_error_feedback``
    Without error feedback (:class:`compress.ErrorFeedback`) training with this codec is known to
    stall or diverge.
``aggregation``
    How decoded contributions of several workers are combined: ``"mean"`` (average), ``"sum"``, or
    ``"majority"`` (element-wise sign of the sum, signSGD's vote).
``sparse``
    Payloads are (index, value) lists, so a sparse allreduce (SparCML) can merge them.
``randomness``
    ``None`` (deterministic), ``"private"`` (its own noise: give every rank a different ``seed``)
    or ``"shared"`` (drawn from ``(seed, key, step)``: give every rank the same ``seed``).

Summable element codecs (none, fp16, bf16, randomk) also speak the *summable protocol* a collective
uses to add representations without decoding them: ``summable_encode(x, key=, step=)`` gives the
representation as one 1-D array, ``summable_add(a, b, out=)`` adds two of them (a NumPy ufunc or a
function with that calling convention), and ``summable_decode(rep, shape=, dtype=, key=, step=)``
turns a (summed) representation back into a dense array. PowerSGD has its own two-round protocol.

Input handling: dtypes outside ``dtypes`` raise ``TypeError`` naming the valid ones; non-contiguous
input is copied to a contiguous array first (never rejected).

Device arrays: ``encode``, ``decode`` and ``sparse_parts`` given a CUDA device array run on the device
(``_encode_device`` and friends, built on :mod:`compress._kernels.cuda`) and return device arrays;
payload bytes are the host's. See :mod:`compress._device`.
"""

from __future__ import annotations

from math import prod
from typing import ClassVar, Sequence

import numpy as np

from ._device import Device, is_device
from ._header import MAX_NDIM, Header, header_nbytes, read_header, write_header
from ._layout import Section, body_nbytes, split_body
from ._util import as_payload

__all__ = ["Codec", "FLOAT_DTYPES"]

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class Codec:
    """Base class of all codecs; see the module docstring."""

    name: ClassVar[str] = ""
    codec_id: ClassVar[int] = 0
    summable: ClassVar[bool] = False
    unbiased: ClassVar[bool] = False
    needs_error_feedback: ClassVar[bool] = False
    aggregation: ClassVar[str] = "mean"
    sparse: ClassVar[bool] = False
    randomness: ClassVar[str | None] = None
    dtypes: ClassVar[tuple[np.dtype, ...]] = FLOAT_DTYPES
    #: header parameters: (name, struct kind) with kind "Q" (uint64) or "d" (float64)
    PARAMS: ClassVar[tuple[tuple[str, str], ...]] = ()

    # ------------------------------------------------------------------ public API
    def encode(self, x, *, key=None, step: int = 0, out=None) -> np.ndarray:
        """Compress ``x`` into one contiguous uint8 payload.

        Parameters
        ----------
        x : array_like or device array
            Float array of a dtype in ``self.dtypes``; copied first if not C-contiguous. A CUDA
            device array (CuPy, Numba) is encoded on its device, into a device payload with the
            same bytes (:mod:`compress._device`).
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
        if is_device(x):
            dev = Device(x)
            return self._encode_device(self._prepare_device(x, dev), dev, key, int(step), out)
        return self._encode(self._prepare(x), key, int(step), out)

    def decode(self, payload, *, count: int | None = None) -> np.ndarray:
        """Decompress a payload of this codec into a new dense array.

        Parameters
        ----------
        count : int, optional
            The number of elements the caller expects. A payload from elsewhere (another rank)
            whose header claims a different count is rejected before anything is allocated, so
            a hostile header cannot make the decoder allocate up to ``MAX_COUNT`` elements.

        Raises
        ------
        ValueError
            If the payload is truncated, padded, corrupted, from another codec or otherwise
            malformed, or holds other than ``count`` elements. Validation finishes before any
            index is used to write.
        """
        if is_device(payload):
            dev = Device(payload)
            hdr, body = self._parse_device(payload, count, dev)
            return self._decode_device(hdr, body, dev).reshape(hdr.shape)
        hdr, body = self._parse(payload, count)
        return self._decode(hdr, body).reshape(hdr.shape)

    def sparse_parts(self, payload, *, count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """For ``sparse`` codecs: the payload as (strictly increasing int64 flat indices, values).

        Validated like :meth:`decode` (every index in range and in order, and ``count`` checked
        if given) before anything is returned, so a sparse allreduce can merge the lists
        without decoding to dense.
        """
        if not self.sparse:
            raise TypeError(f"codec {self.name!r} is not sparse")
        if is_device(payload):
            dev = Device(payload)
            return self._sparse_parts_device(*self._parse_device(payload, count, dev), dev)
        return self._sparse_parts(*self._parse(payload, count))

    def _parse(self, payload, count: int | None = None) -> tuple[Header, dict[str, np.ndarray]]:
        """Validate the header, the parameters, the element count (if expected) and the exact
        length; return the body sections."""
        buf = as_payload(payload)
        return self._check_parsed(buf, read_header(buf, self.codec_id, self.PARAMS), count)

    def _parse_device(self, payload, count, dev):
        """:meth:`_parse` for a device payload: only the header prefix travels to the host."""
        if payload.dtype != np.uint8 or payload.ndim != 1:
            raise TypeError(f"payload must be a 1-D uint8 array, got {payload.ndim}-D {payload.dtype}")
        buf = dev.contiguous(dev.wrap(payload))
        if dev.address(buf) % 8:
            buf = dev.copy(buf)
        prefix = dev.to_host(buf[: min(buf.size, header_nbytes(MAX_NDIM, len(self.PARAMS)))])
        return self._check_parsed(buf, read_header(prefix, self.codec_id, self.PARAMS), count)

    def _check_parsed(self, buf, hdr, count):
        if count is not None and hdr.count != count:
            raise ValueError(f"payload holds {hdr.count} elements, expected {count}")
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

    def aggregate(self, decoded: Sequence[np.ndarray]) -> np.ndarray:
        """Combine decoded arrays of several workers according to ``aggregation``."""
        if not decoded:
            raise ValueError("aggregate needs at least one array")
        total = np.sum(np.stack([np.asarray(d, dtype=np.float64) for d in decoded]), axis=0)
        if self.aggregation == "mean":
            total /= len(decoded)
        elif self.aggregation == "majority":
            total = np.sign(total)
        return total.astype(decoded[0].dtype)

    # ------------------------------------------------------------------ subclass hooks
    def _sections(self, n: int, dtype: np.dtype, params: dict) -> list[Section]:  # pragma: no cover
        raise NotImplementedError

    def _encode(self, x: np.ndarray, key, step: int, out) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _decode(self, hdr: Header, body: dict[str, np.ndarray]) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _sparse_parts(self, hdr: Header, body: dict[str, np.ndarray]):  # pragma: no cover
        raise NotImplementedError

    # device twins of the three hooks above: the same work on device arrays (see compress._device)
    def _encode_device(self, x, dev, key, step: int, out):  # pragma: no cover
        raise NotImplementedError

    def _decode_device(self, hdr: Header, body: dict, dev):  # pragma: no cover
        raise NotImplementedError

    def _sparse_parts_device(self, hdr: Header, body: dict, dev):  # pragma: no cover
        raise NotImplementedError

    def _check_params(self, hdr: Header) -> None:
        """Raise ``ValueError`` when header parameters are impossible (default: nothing to check)."""

    # ------------------------------------------------------------------ helpers for subclasses
    def _new_payload(self, x, out, params: dict, dtype=None, dev=None):
        """A payload for ``x`` (``out`` if given, checked, else new) with its header written;
        return ``(payload, body views)``. With ``dev`` the payload is a device array of that
        :class:`~compress._device.Device` (the header is written on the host and copied over)."""
        dtype = x.dtype if dtype is None else dtype
        sections = self._sections(x.size, np.dtype(dtype), params)
        hlen = header_nbytes(x.ndim, len(self.PARAMS))
        nbytes = hlen + body_nbytes(sections)
        if out is None:
            buf = np.empty(nbytes, dtype=np.uint8) if dev is None else dev.empty(nbytes, np.uint8)
        elif not _usable_out(out, nbytes, dev):
            where = "host" if dev is None else "device"
            raise ValueError(f"out must be a writeable contiguous 1-D uint8 {where} array of exactly "
                             f"{nbytes} bytes (payload_nbytes)")
        else:
            buf = out
        if dev is None:
            write_header(buf, self.codec_id, x.dtype, x.shape, self.PARAMS, params)
        else:
            head = np.empty(hlen, dtype=np.uint8)
            write_header(head, self.codec_id, x.dtype, x.shape, self.PARAMS, params)
            dev.write(buf[:hlen], head)
        return buf, split_body(buf, hlen, sections)

    def _check_dtype(self, dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        if dtype not in self.dtypes:
            valid = ", ".join(str(d) for d in self.dtypes)
            raise TypeError(f"codec {self.name!r} does not support dtype {dtype}; valid dtypes: {valid}")
        return dtype

    def _prepare(self, x) -> np.ndarray:
        x = np.asarray(x)
        self._check_array(x)
        return x if x.flags.c_contiguous else x.copy(order="C")

    def _prepare_any(self, x):
        """:meth:`_prepare` or :meth:`_prepare_device`, for protocols that take either."""
        return self._prepare_device(x, Device(x)) if is_device(x) else self._prepare(x)

    def _prepare_device(self, x, dev):
        x = dev.wrap(x)
        self._check_array(x)
        return dev.contiguous(x)

    def _check_array(self, x) -> None:
        self._check_dtype(x.dtype)
        if x.ndim > MAX_NDIM:
            raise ValueError(f"arrays of more than {MAX_NDIM} dimensions are not supported (got {x.ndim})")


def _usable_out(out, nbytes: int, dev) -> bool:
    """Whether ``out`` can hold a payload of ``nbytes`` on the host (``dev`` None) or that device."""
    if dev is None:
        return (isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.ndim == 1
                and out.flags.c_contiguous and out.flags.writeable and out.size == nbytes)
    return (is_device(out) and out.dtype == np.uint8 and out.ndim == 1 and out.size == nbytes
            and Device(out).cupy == dev.cupy and dev.is_contiguous(out))
