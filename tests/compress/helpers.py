"""Shared test helpers: open a payload into header and body views."""

from __future__ import annotations

import numpy as np

from compress.header import header_nbytes, read_header, write_header
from compress._layout import body_nbytes, split_body

DTYPES = [np.float32, np.float64, np.float16]
SIZES = [0, 1, 7, 8, 9, 100, 4097, 300_001]


def parts(codec, payload):
    """``(header, body views)`` of a payload written by ``codec``."""
    hdr = read_header(payload, codec.codec_id, codec.PARAMS)
    return hdr, split_body(payload, hdr.nbytes, codec._sections(hdr.count, hdr.dtype, hdr.params))


def sample(n, dtype, seed=0, shape=None):
    """Gaussian test data with a few exact zeros and negative zeros."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(dtype)
    if n > 4:
        x[1] = 0.0
        x[3] = -0.0
    return x.reshape(shape) if shape is not None else x


def forged(codec, payload, claim):
    """``(codec, payload, claim)``: ``payload`` (a small valid one of ``codec``) with its header
    rewritten to claim ``claim`` elements (1-D). The body is kept as it is, except PowerSGD's
    factors, sized for a square matrix of about ``claim`` elements at rank 1 (512 KiB for 2**32),
    whose element count is the ``claim`` returned."""
    hdr, _ = parts(codec, payload)
    params = dict(hdr.params)
    if codec.name == "powersgd":
        side = 1 << (claim.bit_length() // 2)
        claim = side * side
        params.update(rows=side, cols=side, rank=1)
        tail = np.zeros(body_nbytes(codec._sections(claim, hdr.dtype, params)), np.uint8)
    else:
        tail = payload[hdr.nbytes:]
    head = np.zeros(header_nbytes(1, len(codec.PARAMS)), np.uint8)
    write_header(head, codec.codec_id, hdr.dtype, (claim,), codec.PARAMS, params)
    return codec, np.concatenate([head, tail]), claim
