"""Edge cases with a documented rule (docs/compression.md, "Non-finite input" and "Zeros"):

* non-finite input (an overflowed gradient) propagates: encoding never fails on it, the payload is
  valid, and the decoded result holds inf or NaN where the codec's rule says, never an all-finite
  array; memories (error feedback, DGC) and PowerSGD's warm start keep their state as it was;
* ``-0.0`` is not negative for the sign codecs: it is sent exactly like ``+0.0``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compress
from helpers import DTYPES, parts, sample

SHAPE = (40, 50)  # a matrix PowerSGD factors, and several buckets for the level codecs
PARAMS = {"topk": {"ratio": 0.01}, "randomk": {"ratio": 0.05, "seed": 1},
          "threshold": {"tau": 1.0}, "dgc": {"density": 0.01, "seed": 2},
          "qsgd": {"bucket": 128, "seed": 3}, "terngrad": {"bucket": 300, "seed": 4},
          "eightbit": {"bucket": 256}, "natural": {"seed": 5}, "powersgd": {"rank": 1}}
BAD = [np.inf, -np.inf, np.nan]
POS = 777  # row 15, column 27; bucket 6 of 128, 2 of 300, 3 of 256


def codec_for(name):
    return compress.get(name, **PARAMS.get(name, {}))


def with_bad(dtype, bad, shape=SHAPE, pos=POS):
    x = sample(int(np.prod(shape)), dtype, seed=11, shape=shape)
    x.reshape(-1)[pos] = bad
    return x


def same_class(a, b):
    """Both NaN, or equal (so ±inf keeps its sign)."""
    return (np.isnan(a) and np.isnan(b)) or a == b


def check_rule(name, codec, x, y, payload, bad):
    """The per-codec part of the rule (docs/compression.md, the table under "Non-finite input")."""
    flat_y, flat_x = y.reshape(-1).astype(np.float64), x.reshape(-1)
    pos = int(np.flatnonzero(~np.isfinite(flat_x))[0])
    finite_elsewhere = np.isfinite(np.delete(flat_y, pos))
    hdr, _ = parts(codec, payload)
    if name in ("none", "fp16", "bf16", "topk", "dgc") or (
            name == "powersgd" and hdr.params["rank"] == 0):
        assert same_class(flat_y[pos], bad)  # sent with its own value
    elif name == "natural":
        assert np.isinf(flat_y[pos]) and (np.isnan(bad) or flat_y[pos] == bad)
    elif name == "randomk":
        idx = codec.indices(x.size, key="k", step=1)
        assert np.isnan(flat_y[idx]).all() and (np.delete(flat_y, idx) == 0).all()
    elif name == "threshold":
        assert np.isnan(hdr.params["tau"]) and np.isnan(flat_y[flat_y != 0]).all()
        assert np.isnan(flat_y[pos])
    elif name in ("qsgd", "terngrad", "eightbit"):
        bucket = hdr.params["bucket"]
        mine = slice(pos // bucket * bucket, (pos // bucket + 1) * bucket)
        assert np.isnan(flat_y[mine]).all()
        rest = np.ones(flat_y.size, bool)
        rest[mine] = False
        assert np.isfinite(flat_y[rest]).all()
        scales = parts(codec, payload)[1]["scales"]
        bits = scales.view({4: np.uint32, 8: np.uint64}[scales.itemsize])
        assert bits[pos // bucket] == compress._util.nan_word(scales.dtype)  # canonical NaN
    elif name == "signsgd":
        assert np.isnan(flat_y).all() and np.isnan(hdr.params["scale"])
    elif name == "efsignsgd":
        assert (np.isnan(flat_y).all() if np.isnan(bad) else np.isinf(flat_y).all())
        assert same_class(flat_y[pos], bad)
    elif name == "onebit":
        if np.isnan(bad):
            assert np.isnan(flat_y).all()
        else:
            side = flat_x < 0 if bad < 0 else ~(flat_x < 0)
            assert (flat_y[side] == bad).all() and np.isfinite(flat_y[~side]).all()
    elif name == "powersgd":
        assert np.isnan(flat_y).all()
    else:  # pragma: no cover - a new codec needs its line here
        raise AssertionError(f"no documented non-finite rule for {name}")
    if name in ("none", "fp16", "bf16", "topk", "dgc", "natural"):
        assert finite_elsewhere.all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", BAD, ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("name", sorted(compress.CODECS))
def test_nonfinite_input_propagates(name, bad, dtype):
    """Every codec: encode works, its payload decodes (never "malformed"), the result is not all
    finite, in the place the rule says; no NumPy warning (one turned into an error on one rank
    would hang a collective)."""
    codec = codec_for(name)
    x = with_bad(dtype, bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        payload = codec.encode(x, key="k", step=1)
        y = codec.decode(payload, count=x.size)
    assert payload.size == codec.payload_nbytes(x.shape, x.dtype, **(
        {"nnz": parts(codec, payload)[0].params["nnz"]} if name in ("threshold", "dgc") else {}))
    assert y.shape == x.shape and y.dtype == x.dtype
    assert not np.isfinite(y).all()
    check_rule(name, codec, x, y, payload, bad)


@pytest.mark.parametrize("name", sorted(compress.CODECS))
def test_every_element_nonfinite_and_tiny_tensors(name):
    """All elements inf or NaN, and 1-element tensors: still valid payloads, non-finite results."""
    for x in (np.full(SHAPE, np.nan, np.float32), np.full(SHAPE, -np.inf, np.float32),
              np.array([np.inf], np.float32), np.array([[np.nan]], np.float64)):
        y = codec_for(name).decode(codec_for(name).encode(x, key="t"))
        assert y.shape == x.shape and not np.isfinite(y).all()


@pytest.mark.parametrize("name", sorted(compress.CODECS))
def test_error_feedback_keeps_its_residual_over_an_overflowed_step(name):
    """A step whose input holds inf leaves the residual as it was (a loss scaler skips that step);
    the next finite step compresses with it and gives a finite result."""
    ef = compress.ErrorFeedback(codec_for(name))
    x = sample(int(np.prod(SHAPE)), np.float32, seed=1, shape=SHAPE)
    ef.encode(x, key="w")
    before, steps = ef.residual("w").copy(), ef.state["w"].steps
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ef.decode(ef.encode(with_bad(np.float32, np.inf), key="w"))
    assert not np.isfinite(y).all()
    np.testing.assert_array_equal(ef.residual("w"), before)
    assert ef.state["w"].steps == steps
    assert np.isfinite(ef.decode(ef.encode(x, key="w"))).all()
    assert np.isfinite(ef.residual("w")).all()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_dgc_memory_keeps_momentum_and_velocity_over_an_overflowed_step():
    memory = compress.DGCMemory(codec_for("dgc"), momentum=0.9)
    x = sample(2000, np.float32, seed=2)
    memory.encode(x, key="w")
    u, v = memory.state["w"].u.copy(), memory.state["w"].v.copy()
    bad = x.copy()
    bad[5] = np.nan
    assert np.isnan(memory.decode(memory.encode(bad, key="w"))).any()
    np.testing.assert_array_equal(memory.state["w"].u, u)
    np.testing.assert_array_equal(memory.state["w"].v, v)
    assert np.isfinite(memory.decode(memory.encode(x, key="w"))).all()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_powersgd_warm_start_skips_an_overflowed_step():
    """The Q of a step whose input overflowed is NaN: the warm start keeps the last finite one."""
    codec = codec_for("powersgd")
    x = sample(int(np.prod(SHAPE)), np.float32, seed=3, shape=SHAPE)
    codec.encode(x, key="w")
    kept = codec.state_dict()["w"].copy()
    assert np.isnan(codec.decode(codec.encode(with_bad(np.float32, np.inf), key="w"))).all()
    np.testing.assert_array_equal(codec.state_dict()["w"], kept)
    fresh = compress.get("powersgd", rank=1)
    fresh.load_state_dict({"w": kept})
    np.testing.assert_array_equal(codec.encode(x, key="w"), fresh.encode(x, key="w"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["signsgd", "efsignsgd", "onebit"])
def test_negative_zero_is_sent_as_zero(name, dtype):
    """-0.0 and +0.0 are the same number: the sign codecs send them alike (bit clear: not
    negative), as GRACE and DeepSpeed do. ReLU-masked gradients are full of -0.0."""
    x = sample(1001, dtype, seed=4)
    x[::3] = 0.0
    negzero = x.copy()
    negzero[::3] = -0.0
    assert np.signbit(negzero[::3]).all()
    codec = compress.get(name)
    payload = codec.encode(negzero)
    np.testing.assert_array_equal(payload, codec.encode(x))
    _, body = parts(codec, payload)
    bits = np.unpackbits(body["bits"], bitorder="little")[:x.size].astype(bool)
    np.testing.assert_array_equal(bits, negzero < 0)
    assert (codec.decode(payload)[::3] > 0).all()  # the non-negative value


def test_onebit_means_split_by_value():
    """1-bit SGD's two values are the means of the non-negative (zeros of either sign included)
    and of the negative entries, as its docs say."""
    g = np.array([-0.0, -0.0, 0.0, 2.0, -1.0, -3.0, -0.0, 4.0], np.float32)  # a ReLU-masked gradient
    hdr, _ = parts(compress.get("onebit"), compress.get("onebit").encode(g))
    assert hdr.params["pos"] == pytest.approx(6.0 / 6) and hdr.params["neg"] == pytest.approx(-4.0 / 2)
    y = compress.get("onebit").decode(compress.get("onebit").encode(g))
    np.testing.assert_array_equal(y, np.where(g < 0, -2.0, 1.0).astype(np.float32))


@given(data=st.data())
@settings(max_examples=80, deadline=None)
def test_radix_select_gives_the_kth_largest_key(data):
    """The top-k kernels' selection (``_kernels.sparse.kth_largest``, a radix select) against a
    sort: every key width, ties, extreme keys, k from 1 to n."""
    from compress._kernels.sparse import kth_largest

    dtype = data.draw(st.sampled_from([np.uint16, np.uint32, np.uint64]))
    top = int(np.iinfo(dtype).max)
    keys = np.array(data.draw(st.lists(st.one_of(st.sampled_from([0, 1, top, top - 1, 255, 256]),
                                                 st.integers(0, top)),
                                       min_size=1, max_size=300)), dtype=dtype)
    k = data.draw(st.integers(1, keys.size))
    assert kth_largest(keys, k) == np.sort(keys)[keys.size - k]
