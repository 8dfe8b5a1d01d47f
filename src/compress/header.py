"""Payload header: packing and validation.

Every payload is one contiguous ``np.uint8`` array: a header followed by the codec's body. All fields
are little-endian; every field after the first 16 bytes is 8 bytes wide, so the body starts 8-byte
aligned.

=======  =====================  ==========================================================
offset   field                  meaning
=======  =====================  ==========================================================
0        4 bytes                magic ``b"GCZ\\x00"``
4        uint8                  format version (:data:`VERSION`)
5        uint8                  codec id (``Codec.codec_id``)
6        uint8                  dtype code: 1 float16, 2 float32, 3 float64
7        uint8                  ndim, at most :data:`MAX_NDIM`
8        uint64                 element count (must equal the product of the shape)
16       ndim x uint64          shape
16+8nd   P x 8 bytes            codec parameters (``Codec.PARAMS``: uint64 ``Q`` or float64 ``d``)
=======  =====================  ==========================================================

So ``header_nbytes = 16 + 8 * ndim + 8 * P``.

Public, for reading what a payload says about itself: ``read_header(payload, codec.codec_id,
codec.PARAMS)`` checks the framing and returns a :class:`Header` (dtype, shape, count, the
codec's parameters as written: a quantizer's levels and bucket, a random codec's stream), as
``Codec.decode`` does before it reads the body. :func:`write_header` is the codecs' own
(``compress.base``). The wire format of every codec: docs/compression.md.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod

import numpy as np

__all__ = [
    "MAGIC",
    "VERSION",
    "MAX_NDIM",
    "MAX_COUNT",
    "DTYPE_CODES",
    "Header",
    "header_nbytes",
    "write_header",
    "read_header",
]

MAGIC = b"GCZ\x00"
VERSION = 1
MAX_NDIM = 8
MAX_COUNT = 1 << 40
DTYPE_CODES = {1: np.dtype(np.float16), 2: np.dtype(np.float32), 3: np.dtype(np.float64)}
_CODE_OF = {dt: code for code, dt in DTYPE_CODES.items()}
_FIXED = struct.Struct("<4sBBBBQ")


@dataclass(frozen=True)
class Header:
    """A parsed, validated header."""

    codec_id: int
    dtype: np.dtype
    shape: tuple[int, ...]
    count: int
    params: dict
    nbytes: int


def header_nbytes(ndim: int, nparams: int) -> int:
    """Header size in bytes for ``ndim`` dimensions and ``nparams`` codec parameters."""
    return _FIXED.size + 8 * ndim + 8 * nparams


def _params_struct(params_spec) -> struct.Struct:
    return struct.Struct("<" + "".join(kind for _, kind in params_spec))


def write_header(buf: np.ndarray, codec_id: int, dtype: np.dtype, shape, params_spec, params: dict):
    """Write a header into the start of ``buf``; return its length in bytes."""
    shape = tuple(int(s) for s in shape)
    mv = memoryview(buf)
    _FIXED.pack_into(mv, 0, MAGIC, VERSION, codec_id, _CODE_OF[np.dtype(dtype)], len(shape), prod(shape))
    off = _FIXED.size
    struct.pack_into(f"<{len(shape)}Q", mv, off, *shape)
    off += 8 * len(shape)
    _params_struct(params_spec).pack_into(mv, off, *(params[name] for name, _ in params_spec))
    return off + 8 * len(params_spec)


def read_header(buf: np.ndarray, codec_id: int, params_spec) -> Header:
    """Parse and check the header of ``buf`` for codec ``codec_id``; raise ``ValueError`` if bad."""
    if buf.size < _FIXED.size:
        raise ValueError(f"payload of {buf.size} bytes is shorter than the {_FIXED.size}-byte header")
    mv = memoryview(buf)
    magic, version, cid, dcode, ndim, count = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise ValueError(f"bad magic {magic!r}: not a compress payload")
    if version != VERSION:
        raise ValueError(f"unsupported payload format version {version} (this library writes {VERSION})")
    if cid != codec_id:
        raise ValueError(f"payload was written by codec id {cid}, not by this codec (id {codec_id})")
    if dcode not in DTYPE_CODES:
        raise ValueError(f"unknown dtype code {dcode}; valid codes are {sorted(DTYPE_CODES)}")
    if ndim > MAX_NDIM:
        raise ValueError(f"ndim {ndim} exceeds the maximum of {MAX_NDIM}")
    nbytes = header_nbytes(ndim, len(params_spec))
    if buf.size < nbytes:
        raise ValueError(f"payload of {buf.size} bytes is shorter than its {nbytes}-byte header")
    shape = struct.unpack_from(f"<{ndim}Q", mv, _FIXED.size)
    if prod(shape) != count:
        raise ValueError(f"shape {shape} does not hold the recorded count {count}")
    if count > MAX_COUNT:
        raise ValueError(f"element count {count} exceeds the limit {MAX_COUNT}")
    values = _params_struct(params_spec).unpack_from(mv, _FIXED.size + 8 * ndim)
    params = {name: v for (name, _), v in zip(params_spec, values)}
    return Header(cid, DTYPE_CODES[dcode], tuple(shape), count, params, nbytes)
