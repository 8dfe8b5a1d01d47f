"""Decoders reject malformed payloads with ValueError and never write out of bounds."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import compress
from helpers import forged, parts, sample

PARAMS = {"topk": {"ratio": 0.2}, "randomk": {"ratio": 0.3}, "threshold": {"tau": 0.5},
          "dgc": {"density": 0.2}, "powersgd": {"rank": 2}}
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 60)), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def valid(name, n=37, dtype=np.float32, shape=None):
    codec = compress.get(name, **PARAMS.get(name, {}))
    return codec, codec.encode(sample(n, dtype, seed=n, shape=shape), key="k", step=2)


def check_decode(codec, data):
    """Decoding either raises ValueError or returns a well-formed array."""
    try:
        out = codec.decode(data)
    except ValueError:
        return None
    assert isinstance(out, np.ndarray)
    return out


NAMES = sorted(compress.CODECS)


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes(name, data):
    codec = compress.get(name, **PARAMS.get(name, {}))
    with pytest.raises(ValueError):
        codec.decode(data)  # no magic: always rejected


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(body=st.binary(max_size=400), cut=st.integers(0, 400))
def test_valid_header_random_body(name, body, cut):
    codec, payload = valid(name)
    hdr, _ = parts(codec, payload)
    data = payload[: hdr.nbytes].tobytes() + body
    out = check_decode(codec, data)
    if out is not None:
        assert out.shape == (37,) and len(data) == payload.size


@pytest.mark.parametrize("name", NAMES)
def test_every_truncation_and_extension(name):
    codec, payload = valid(name)
    for cut in range(payload.size):
        with pytest.raises(ValueError):
            codec.decode(payload[:cut])
    with pytest.raises(ValueError):
        codec.decode(np.concatenate([payload, np.zeros(1, np.uint8)]))


@pytest.mark.parametrize("name", NAMES)
@FUZZ
@given(flips=st.lists(st.integers(0, 10_000), min_size=1, max_size=3), shape2d=st.booleans())
@example(flips=[64, 864], shape2d=False)  # count and shape 36 -> 37: randomk decodes 37
def test_bit_flips(name, flips, shape2d):
    codec, payload = valid(name, n=36, shape=(6, 6) if shape2d else None)
    bad = payload.copy()
    for f in flips:
        bad[(f // 8) % bad.size] ^= np.uint8(1 << (f % 8))
    out = check_decode(codec, bad)
    if out is not None:  # the size its header records: flips of both the count and the shape
        # (bytes 8 and 16) make a well-formed payload of another size, as for a sparse codec,
        # whose body's size does not depend on the count
        count = int(np.frombuffer(bad[8:16].tobytes(), "<u8")[0])
        shape = tuple(np.frombuffer(bad[16:16 + 8 * bad[7]].tobytes(), "<u8").tolist())
        assert out.size == count and out.shape in ((count,), shape), (out.shape, count, shape)
        assert count == 36 or flips_hit_the_count(flips, bad.size), (count, flips)


def flips_hit_the_count(flips, size):
    """Whether a flip of ``flips`` fell on the header's count (bytes 8-15)."""
    return any(8 <= (f // 8) % size < 16 for f in flips)


def test_misaligned_and_foreign_payloads():
    codec, payload = valid("topk")
    shifted = np.empty(payload.size + 1, np.uint8)[1:]
    shifted[:] = payload
    np.testing.assert_array_equal(codec.decode(shifted), codec.decode(payload))
    with pytest.raises(ValueError, match="codec id"):
        compress.get("randomk").decode(payload)
    with pytest.raises(TypeError):
        codec.decode(payload.view(np.int8))


@pytest.mark.parametrize("name,field,value", [
    ("topk", "indices", None),  # out-of-order / out-of-range indices
    ("threshold", "words", None),
])
def test_hostile_indices_rejected(name, field, value):
    codec, payload = valid(name, n=1000)
    for mutate in (lambda a: a.__setitem__(0, 5000), lambda a: a.__setitem__(1, a[0]),
                   lambda a: a.__setitem__(-1, np.iinfo(a.dtype).max)):
        bad = payload.copy()
        _, body = parts(codec, bad)
        mutate(body[field])
        with pytest.raises(ValueError):
            codec.decode(bad)


@pytest.mark.parametrize("levels", [1, 3, 127])
def test_level_codes_above_range_rejected(levels):
    codec = compress.get("qsgd", levels=levels, bucket=8)
    payload = codec.encode(sample(16, np.float32))
    _, body = parts(codec, payload)
    body["codes"][0] = 0xFF
    with pytest.raises(ValueError):
        codec.decode(payload)


# ---------------------------------------------------------------- forged element counts
@pytest.mark.parametrize("name", NAMES)
def test_forged_huge_count_is_a_value_error(name):
    """A payload of at most a few hundred bytes (PowerSGD: its 512 KiB of rank-1 factors) that
    claims 2**31 - 1 elements (PowerSGD 2**32, dense formats 2**40) is rejected
    before anything of that size is allocated; before the limit, sparse and low-rank decodes
    allocated GiB or raised MemoryError."""
    claim = 1 << 40 if not (compress.CODECS[name].sparse or name == "powersgd") else (1 << 31) - 1
    codec, payload, claim = forged(*valid(name), claim)
    assert payload.nbytes <= (300 if name != "powersgd" else 300 + (1 << 19))
    with pytest.raises(ValueError):
        codec.decode(payload)
    if codec.sparse:
        with pytest.raises(ValueError):
            codec.sparse_parts(payload)
        with pytest.raises(ValueError):
            codec.sparse_views(payload)


@pytest.mark.parametrize("name", ["topk", "threshold", "dgc", "randomk", "powersgd"])
def test_max_elements_allows_more_explicitly(name):
    """The limit names itself and is lifted for one call by ``max_elements=`` or by ``count=``."""
    codec, payload, claim = forged(*valid(name), 1 << 12)
    with pytest.raises(ValueError, match="max_elements"):
        codec.decode(payload, max_elements=claim - 1)
    assert codec.decode(payload, max_elements=claim).size == claim
    assert codec.decode(payload, count=claim).size == claim
    with pytest.raises(ValueError, match="max_elements"):
        codec.decode(payload, count=claim, max_elements=claim - 1)
    with pytest.raises(ValueError, match="non-negative integer"):
        codec.decode(payload, max_elements=-1)
    assert compress.DECODE_MAX_ELEMENTS == 1 << 28
