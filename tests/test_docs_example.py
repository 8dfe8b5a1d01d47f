"""The worked example of docs/compression.md ("Adding a codec") runs as written: one file plus one
table entry make a codec that compress, its registry and the compressed allreduce accept."""

import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import compress
from collectives.compressed.strategies import strategy_for

DOC = Path(__file__).resolve().parent.parent / "docs" / "compression.md"


@pytest.fixture
def int8(monkeypatch):
    """The example's module, loaded from the docs as ``compress.codecs.int8``, in the table."""
    text = DOC.read_text()
    code = re.search(r"<!-- example: compress/codecs/int8.py -->\n```python\n(.*?)```", text, re.S)
    assert code, "the worked example is missing from docs/compression.md"
    module = types.ModuleType("compress.codecs.int8")
    module.__package__ = "compress.codecs"
    exec(compile(code.group(1), "compress/codecs/int8.py", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(compress.CODECS, "int8", module.Int8)
    return module.Int8


def test_example_codec_round_trip_and_size(int8):
    codec = compress.get("int8")
    assert isinstance(codec, int8) and compress.codecs.Int8 is int8
    assert codec.codec_id not in {c.codec_id for n, c in compress.CODECS.items() if n != "int8"}
    x = np.random.default_rng(0).standard_normal((7, 9)).astype(np.float32)
    payload = codec.encode(x)
    assert payload.size == codec.payload_nbytes(x.shape) == 16 + 8 * 2 + 8 + x.size
    y = codec.decode(payload)
    assert y.shape == x.shape and y.dtype == x.dtype
    scale = np.abs(x).max() / 127
    assert np.abs(y - x).max() <= scale / 2 + 1e-6
    np.testing.assert_array_equal(codec.decode(codec.encode(np.zeros(3, np.float64))), np.zeros(3))


def test_example_codec_rejects_bad_payloads(int8):
    codec = compress.get("int8")
    payload = codec.encode(np.ones(5, np.float32))
    bad = payload.copy()
    bad[-13:-5] = np.frombuffer(np.float64(-1.0).tobytes(), np.uint8)  # the scale
    with pytest.raises(ValueError, match="scale"):
        codec.decode(bad)
    with pytest.raises(ValueError, match="bytes"):
        codec.decode(payload[:-1])
    with pytest.raises(ValueError, match="codec id"):
        compress.get("fp16").decode(payload)


def test_example_codec_follows_the_non_finite_rule(int8):
    """The example teaches the rule every codec follows: non-finite input decodes to inf/NaN."""
    codec = compress.get("int8")
    for bad in (np.inf, np.nan):
        x = np.linspace(-1, 1, 9, dtype=np.float32)
        x[4] = bad
        assert np.isnan(codec.decode(codec.encode(x))).all()


def test_example_codec_in_a_compressed_allreduce(int8):
    codec = compress.get("int8")
    assert not codec.summable and not codec.sparse and strategy_for(codec) == "allgather"
    x = np.linspace(-1, 1, 101, dtype=np.float32)
    y = collectives.compressed_allreduce(x, codec, comm=MPI.COMM_SELF, key="w")
    np.testing.assert_array_equal(y, codec.decode(codec.encode(x)))
