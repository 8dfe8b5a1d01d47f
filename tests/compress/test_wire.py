"""Payload sizes equal the documented formulas, for many sizes, shapes and dtypes."""

from __future__ import annotations

import math

import numpy as np
import pytest

import compress
from helpers import DTYPES, SIZES, parts, sample


def header(ndim, nparams):
    return 16 + 8 * ndim + 8 * nparams


def scale_size(dtype):
    return 8 if np.dtype(dtype) == np.float64 else 4


def k_of(n, ratio):
    return 0 if n == 0 else min(n, max(1, math.ceil(ratio * n - 1e-9)))


# documented body formulas, written out independently of the codec code
FORMULAS = {
    "none": ({}, 0, lambda n, isz, S, p: n * isz),
    "fp16": ({}, 0, lambda n, isz, S, p: 2 * n),
    "bf16": ({}, 0, lambda n, isz, S, p: 2 * n),
    "topk": ({"ratio": 0.01}, 1, lambda n, isz, S, p: k_of(n, 0.01) * (4 + isz)),
    "randomk": ({"ratio": 0.05}, 3, lambda n, isz, S, p: k_of(n, 0.05) * isz),
    "threshold": ({"tau": 1.0}, 2, lambda n, isz, S, p: 4 * p["nnz"]),
    "dgc": ({"density": 0.01}, 1, lambda n, isz, S, p: p["nnz"] * (4 + isz)),
    "qsgd": ({"levels": 127, "bucket": 512}, 3, lambda n, isz, S, p: -(-n // 512) * S + n),
    "terngrad": ({}, 3, lambda n, isz, S, p: (1 if n else 0) * S + -(-2 * n // 8)),
    "signsgd": ({}, 1, lambda n, isz, S, p: -(-n // 8)),  # the scale: 1, or NaN for non-finite input
    "efsignsgd": ({}, 1, lambda n, isz, S, p: -(-n // 8)),
    "onebit": ({}, 2, lambda n, isz, S, p: -(-n // 8)),
    "eightbit": ({"bucket": 2048}, 3, lambda n, isz, S, p: -(-n // 2048) * S + n),
    "natural": ({}, 1, lambda n, isz, S, p: n + -(-n // 8)),
    "powersgd": ({"rank": 4}, 3, lambda n, isz, S, p: n * isz),  # 1-d tensors travel raw
}


def test_every_codec_has_a_formula():
    assert set(FORMULAS) == set(compress.CODECS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_payload_size_matches_formula(name, n, dtype):
    params, nparams, body = FORMULAS[name]
    codec = compress.get(name, **params)
    x = sample(n, dtype, seed=n)
    payload = codec.encode(x)
    assert payload.dtype == np.uint8 and payload.ndim == 1 and payload.flags.c_contiguous
    hdr, _ = parts(codec, payload)
    want = header(1, nparams) + body(n, np.dtype(dtype).itemsize, scale_size(dtype), hdr.params)
    assert payload.size == want
    data = {"nnz": hdr.params["nnz"]} if name in ("threshold", "dgc") else {}
    assert codec.payload_nbytes(n, dtype, **data) == want


@pytest.mark.parametrize("bits_levels", [(2, 1), (3, 3), (4, 7), (5, 15), (9, 255), (16, 32767)])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1001])
def test_qsgd_bit_widths(bits_levels, n):
    bits, levels = bits_levels
    codec = compress.get("qsgd", levels=levels, bucket=100)
    payload = codec.encode(sample(n, np.float32))
    assert payload.size == header(1, 3) + -(-n // 100) * 4 + -(-n * bits // 8)


@pytest.mark.parametrize("shape", [(), (3, 5), (2, 3, 4), (1,) * 8])
def test_shape_is_part_of_the_header(shape):
    codec = compress.get("fp16")
    x = sample(int(np.prod(shape)), np.float32, shape=shape)
    payload = codec.encode(x)
    assert payload.size == header(len(shape), 0) + 2 * x.size == codec.payload_nbytes(shape, np.float32)
    assert codec.decode(payload).shape == shape


def test_powersgd_matrix_size():
    codec = compress.get("powersgd", rank=4)
    x = sample(600, np.float32, shape=(20, 30))
    assert codec.encode(x).size == header(2, 3) + (20 + 30) * 4 * 4 == codec.payload_nbytes((20, 30))


def powersgd_body(shape, dtype, rank, rate):
    """The documented rule, written out: (body bytes, factored?). Factors for a tensor of two or
    more dimensions whose factors take under 1/rate of its bytes, else the raw values."""
    n, isz = int(np.prod(shape)), np.dtype(dtype).itemsize
    if len(shape) < 2:
        return n * isz, False
    rows, cols = shape[0], int(np.prod(shape[1:]))
    factors = (rows + cols) * min(rank, rows, cols) * scale_size(dtype)
    return (factors, True) if factors * rate < n * isz else (n * isz, False)


@pytest.mark.parametrize("rank,rate", [(1, 2.0), (4, 2.0), (2, 1.0), (1, 0.0)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (5,), (1001,), (1, 1), (2, 2), (3, 3), (4, 4),
                                   (5, 5), (8, 8), (2, 1000), (1000, 2), (3, 4, 5), (0, 7), (16, 1, 3)])
def test_powersgd_sends_what_does_not_gain_uncompressed(shape, dtype, rank, rate):
    """1-d tensors (n + 1 floats as factors: more than raw) and matrices too small to gain are
    sent as they are, never larger than raw; their payloads decode to the input exactly."""
    codec = compress.get("powersgd", rank=rank, min_compression_rate=rate)
    x = sample(int(np.prod(shape)), dtype, seed=3, shape=shape)
    payload = codec.encode(x, key="w")
    body, factored = powersgd_body(shape, dtype, rank, rate)
    assert payload.size == header(len(shape), 3) + body == codec.payload_nbytes(shape, dtype)
    assert codec.compresses(shape, dtype) == factored
    assert body <= x.nbytes or rate < 1  # rate 0 factors every non-empty matrix
    hdr, _ = parts(codec, payload)
    assert (hdr.params["rank"] == 0) != factored
    if not factored:
        y = codec.decode(payload)
        assert y.shape == x.shape and y.dtype == x.dtype
        np.testing.assert_array_equal(y.reshape(-1).view(np.uint8), x.reshape(-1).view(np.uint8))


def test_header_fields():
    payload = compress.get("topk", ratio=0.5).encode(np.arange(6, dtype=np.float64).reshape(2, 3))
    assert payload[:4].tobytes() == b"GCZ\x00"
    assert list(payload[4:8]) == [1, compress.TopK.codec_id, 3, 2]
    assert np.frombuffer(payload[8:40].tobytes(), "<u8").tolist() == [6, 2, 3, 3]
