"""The public surface: catalogue, properties, input checks, state objects."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import compress
from helpers import sample


def test_catalogue_and_unknown_names():
    assert len(compress.CODECS) == 15
    assert len({cls.codec_id for cls in compress.CODECS.values()}) == 15
    for name, cls in compress.CODECS.items():
        assert cls.name == name and isinstance(compress.get(name), cls)
    with pytest.raises(ValueError, match="valid names: none, fp16"):
        compress.get("zip")


@pytest.mark.parametrize("name", sorted(compress.CODECS))
def test_properties_declared(name):
    codec = compress.get(name)
    assert isinstance(codec.summable, bool) and isinstance(codec.unbiased, bool)
    assert isinstance(codec.needs_error_feedback, bool)
    assert codec.aggregation in ("sum", "mean", "majority")


def test_property_table():
    summable = {n for n in compress.CODECS if compress.get(n).summable}
    assert summable == {"none", "fp16", "bf16", "randomk", "powersgd"}
    unbiased = {n for n in compress.CODECS if compress.get(n).unbiased}
    assert unbiased == {"none", "qsgd", "terngrad", "natural"}
    assert compress.get("signsgd").aggregation == "majority"


@pytest.mark.parametrize("name", sorted(compress.CODECS))
def test_dtype_and_layout_handling(name):
    codec = compress.get(name)
    with pytest.raises(TypeError, match="valid dtypes"):
        codec.encode(np.arange(10, dtype=np.int32))
    x = sample(120, np.float64, shape=(12, 10))
    strided = x[:, ::2]
    assert not strided.flags.c_contiguous
    y = codec.decode(codec.encode(strided, key="s"))
    assert y.shape == (12, 5) and y.dtype == np.float64


@pytest.mark.parametrize("name,bad", [
    ("topk", {"ratio": 0}), ("topk", {"ratio": 1.5}), ("randomk", {"seed": None}),
    ("qsgd", {"levels": 0}), ("qsgd", {"bucket": 0}), ("threshold", {"tau": -1.0}),
    ("dgc", {"density": 2.0}), ("powersgd", {"rank": 0}), ("eightbit", {"bucket": 0}),
])
def test_parameters_validated(name, bad):
    with pytest.raises(ValueError):
        compress.get(name, **bad)


def test_error_feedback_state():
    with pytest.raises(ValueError):
        compress.ErrorFeedback("topk")
    with pytest.raises(ValueError):
        compress.DGCMemory(compress.get("topk"), momentum=1.0)
    ef = compress.ErrorFeedback(compress.get("topk", ratio=0.1))
    x = sample(50, np.float32)
    y = ef.decode(ef.encode(x, key="a"))
    np.testing.assert_allclose(ef.residual("a"), x - y)
    with pytest.raises(ValueError, match="shape"):
        ef.encode(sample(60, np.float32), key="a")
    ef.reset("a")
    assert ef.residual("a") is None


def test_aggregate_majority_and_mean():
    sign = compress.get("signsgd")
    votes = [np.array([1.0, -1.0, 1.0]), np.array([1.0, -1.0, -1.0]), np.array([-1.0, -1.0, -1.0])]
    np.testing.assert_array_equal(sign.aggregate(votes), [1.0, -1.0, -1.0])
    np.testing.assert_allclose(compress.get("none").aggregate(votes), np.mean(votes, axis=0))


def test_compress_never_imports_mpi():
    code = "import sys, compress; assert not any(m.startswith('mpi4py') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_codec_specs_parse_like_the_command_line():
    assert compress.parse_spec("topk:ratio=0.01") == ("topk", {"ratio": 0.01})
    assert compress.parse_spec("randomk:ratio=0.5,seed=3,unbiased_scaling=true") == (
        "randomk", {"ratio": 0.5, "seed": 3, "unbiased_scaling": True})
    assert compress.parse_spec("fp16") == ("fp16", {})
    codec = compress.from_spec("qsgd:levels=7", seed=1)
    assert codec.levels == 7
    with pytest.raises(ValueError, match="key=value"):
        compress.parse_spec("topk:ratio")
    with pytest.raises(ValueError, match="unknown codec"):
        compress.from_spec("zip:level=9")


def test_spec_values_are_typed_by_the_codecs_parameters():
    """Command-line values take the kind the codec declares: int, float, bool."""
    name, params = compress.parse_spec("topk:ratio=1")
    assert params == {"ratio": 1.0} and type(params["ratio"]) is float
    _, params = compress.parse_spec("powersgd:rank=2,warm_start=no,seed=4")
    assert params == {"rank": 2, "warm_start": False, "seed": 4}
    assert type(params["rank"]) is int and params["warm_start"] is False
    assert compress.parse_spec("randomk:unbiased_scaling=1")[1] == {"unbiased_scaling": True}
    assert compress.registry.parameters("topk") == {"ratio": "float"}
    assert compress.registry.parameters("qsgd")["levels"] == "int"
    for spec, words in [("topk:ratio=abc", "topk parameter 'ratio' takes a number, got 'abc'"),
                        ("qsgd:levels=7.5", "qsgd parameter 'levels' takes an integer"),
                        ("randomk:unbiased_scaling=maybe", "takes true or false")]:
        with pytest.raises(ValueError, match=words):
            compress.parse_spec(spec)


@pytest.mark.parametrize("call, words", [
    (lambda: compress.get("topk", k=5), "topk has no parameter 'k'; its parameters are: ratio"),
    (lambda: compress.from_spec("randomk:k=5"),
     "randomk has no parameter 'k'; its parameters are: ratio, seed, unbiased_scaling"),
    (lambda: compress.get("fp16", ratio=0.1), "fp16 has no parameter 'ratio'; it takes no"),
])
def test_unknown_parameters_are_named_in_the_users_words(call, words):
    with pytest.raises(ValueError, match=words) as info:
        call()
    assert "__init__" not in str(info.value)


def test_randomness_is_declared():
    declared = {name: cls.randomness for name, cls in compress.CODECS.items() if cls.randomness}
    assert declared == {"qsgd": "private", "terngrad": "private", "natural": "private",
                        "dgc": "private", "randomk": "shared", "powersgd": "shared"}
    for name, cls in compress.CODECS.items():  # every random codec takes a seed
        assert (cls.randomness is not None) == ("seed" in getattr(cls, "__dataclass_fields__", {})), name


@pytest.mark.parametrize("name,params", [("topk", {"ratio": 0.05}), ("threshold", {"tau": 1.0}),
                                         ("dgc", {"density": 0.05, "seed": 1})])
def test_sparse_parts_match_decode(name, params):
    codec = compress.get(name, **params)
    x = sample(3001, np.dtype(np.float32), seed=9)
    payload = codec.encode(x)
    idx, vals = codec.sparse_parts(payload)
    dense = codec.decode(payload)
    assert idx.dtype == np.int64 and (np.diff(idx) > 0).all()
    np.testing.assert_array_equal(dense[idx], vals)
    assert np.count_nonzero(np.delete(dense, idx)) == 0
    views = codec.sparse_views(payload)  # the same lists, uint32 indices; top-k's and DGC's
    assert views[0].dtype == np.uint32  # are the payload's own bytes
    np.testing.assert_array_equal(views[0], idx)
    np.testing.assert_array_equal(views[1], vals)
    assert all(np.shares_memory(v, payload) for v in views) == (name != "threshold")
    broken = payload.copy()
    broken[-1] ^= 0xFF  # the last index goes out of order or range
    for read in (codec.sparse_parts, codec.sparse_views):
        with pytest.raises(ValueError):
            read(broken)
        with pytest.raises(TypeError, match="not sparse"):
            getattr(compress.get("fp16"), read.__name__)(compress.get("fp16").encode(x))


@pytest.mark.parametrize("name", ["none", "fp16", "bf16", "topk", "randomk", "signsgd",
                                  "efsignsgd", "onebit", "qsgd", "natural", "eightbit"])
def test_encode_into_a_reused_buffer(name):
    """encode(out=) writes the same payload into the caller's buffer and returns it."""
    params = {"seed": 3} if compress.CODECS[name].randomness == "private" else {}
    x = sample(1001, np.dtype(np.float32), seed=2)
    fresh = compress.get(name, **params).encode(x, key="k", step=1)
    out = np.full(compress.get(name, **params).payload_nbytes(x.shape), 0xAB, np.uint8)
    got = compress.get(name, **params).encode(x, key="k", step=1, out=out)
    assert got is out
    np.testing.assert_array_equal(out, fresh)
    with pytest.raises(ValueError, match="exactly"):
        compress.get(name, **params).encode(x, out=np.empty(out.size + 1, np.uint8))


def test_decode_with_expected_count_rejects_other_counts_before_allocating():
    """A header claiming a huge count is refused when the caller says what it expects."""
    import struct

    codec = compress.get("topk", ratio=0.1)
    x = sample(100, np.dtype(np.float32), seed=1)
    payload = codec.encode(x)
    assert codec.decode(payload, count=100).shape == (100,)
    hostile = payload.copy()
    struct.pack_into("<QQ", hostile, 8, 1 << 39, 1 << 39)  # count and shape: 2**39 elements
    with pytest.raises(ValueError, match="expected 100"):
        codec.decode(hostile, count=100)
    with pytest.raises(ValueError, match="expected 100"):
        codec.sparse_parts(hostile, count=100)
    with pytest.raises(ValueError, match="expected 100"):
        codec.sparse_views(hostile, count=100)
    with pytest.raises(ValueError, match="expected 99"):
        compress.ErrorFeedback(codec).decode(payload, count=99)


def test_protocols_decide_summable_and_sparse():
    """summable and sparse follow from the protocols a codec subclasses, and cannot be claimed
    without them."""
    from compress.base import Codec

    for name, cls in compress.CODECS.items():
        assert cls.summable == issubclass(cls, (compress.ElementSummable, compress.LowRankSummable))
        assert cls.sparse == issubclass(cls, compress.SparsePayload), name
    assert {n for n, c in compress.CODECS.items() if c.summable} == \
        {"none", "fp16", "bf16", "randomk", "powersgd"}
    assert {n for n, c in compress.CODECS.items() if c.sparse} == {"topk", "threshold", "dgc"}
    with pytest.raises(TypeError, match="summable = True"):
        type("Fake", (Codec,), {"summable": True})
    with pytest.raises(TypeError, match="is not sparse"):
        compress.get("fp16").sparse_parts(compress.get("fp16").encode(np.ones(3, np.float32)))


def test_codec_state_dict_restores_the_private_generator():
    a = compress.get("qsgd", seed=3)
    a.encode(np.ones(64, np.float32))
    saved = a.state_dict()
    assert set(saved) == {"rng"} and compress.get("fp16").state_dict() == {}
    first = a.encode(np.linspace(-1, 1, 64, dtype=np.float32))
    b = compress.get("qsgd", seed=99)
    b.load_state_dict(saved)
    np.testing.assert_array_equal(b.encode(np.linspace(-1, 1, 64, dtype=np.float32)), first)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("name", ["none", "fp16", "bf16", "randomk"])
def test_summable_decode_into_out(name, dtype):
    """``summable_decode(..., out=)`` writes the bits the call without ``out`` returns into
    ``out`` (flat, in the tensor's shape, or a strided view) and returns ``out``'s memory in
    ``shape``; the summable allreduce decodes into its result this way."""
    codec = compress.from_spec("randomk:ratio=0.3,seed=4" if name == "randomk" else name)
    if np.dtype(dtype) not in codec.dtypes:
        pytest.skip(f"{name} takes no {np.dtype(dtype)}")
    shape = (7, 11)
    x = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    x[0, :3] = [-0.0, np.inf, np.nan]
    rep = codec.summable_encode(x, key="k")
    codec.summable_add(rep, rep, rep)  # a sum, as the allreduce decodes one
    want = codec.summable_decode(rep, shape=shape, dtype=dtype, key="k")
    flat = np.full(x.size, 7, dtype)
    shaped = np.full(shape, 7, dtype)
    strided = np.full((x.size, 2), 7, dtype)[:, 0]
    for out in (flat, shaped, strided):
        got = codec.summable_decode(rep, shape=shape, dtype=dtype, key="k", out=out)
        assert got.shape == shape
        assert np.array_equal(np.ascontiguousarray(got).view(np.uint8),
                              want.view(np.uint8)), (name, out.shape)
        assert np.array_equal(np.ascontiguousarray(out).reshape(shape).view(np.uint8),
                              want.view(np.uint8))
        if out.flags.c_contiguous:
            assert np.shares_memory(got, out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("name", sorted(compress.CODECS))
def test_decode_into_out(name, dtype):
    """``decode(payload, out=)`` writes the bits ``decode(payload)`` returns into ``out`` (flat
    or in the tensor's shape), returns ``out``'s memory in the payload's shape, and refuses an
    ``out`` of another size or dtype, or not contiguous, before writing anything; the
    compressed allgather decodes into its result this way."""
    params = {"seed": 3} if compress.CODECS[name].randomness == "private" else {}
    codec = compress.get(name, **params)
    if np.dtype(dtype) not in codec.dtypes:
        pytest.skip(f"{name} takes no {np.dtype(dtype)}")
    shape = (13, 11)
    x = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    x[0, :2] = [-0.0, 1e-3]
    payload = codec.encode(x, key="k", step=1)
    want = codec.decode(payload, count=x.size)
    for out in (np.full(x.size, 7, dtype), np.full(shape, 7, dtype)):
        got = codec.decode(payload, count=x.size, out=out)
        assert got.shape == want.shape and np.shares_memory(got, out)
        assert np.array_equal(out.reshape(want.shape).view(np.uint8), want.view(np.uint8))
    other = np.float32 if np.dtype(dtype) != np.float32 else np.float64
    for bad in (np.zeros(x.size + 1, dtype), np.zeros(x.size, other),
                np.zeros((x.size, 2), dtype)[:, 0]):
        before = bad.copy()
        with pytest.raises(ValueError, match="out must be"):
            codec.decode(payload, out=bad)
        assert np.array_equal(bad, before)
