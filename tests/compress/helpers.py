"""Shared test helpers: open a payload into header and body views."""

from __future__ import annotations

import numpy as np

from compress._header import read_header
from compress._layout import split_body

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
