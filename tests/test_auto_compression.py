"""Serial tests of codec="auto:<spec>": its spelling, the tuning file's codec speeds, the lookup
of a codec's speed, the memories' flush, and the entry points that take the spelling.
(The decisions across ranks and the switching: tests/mpi/mpi_compressed_auto.py.)"""

import json

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import compress
from collectives import AutoCompression, CompressionState
from collectives.compressed.auto import AUTO_FORMS, DEFAULT_SPEEDS, _speed_for, split_spec
from collectives.selection import tuning_file
from collectives.sgd.cli import UsageError, parse


@pytest.mark.parametrize("spec, inner", [("auto:topk:ratio=0.01", "topk:ratio=0.01"),
                                         ("auto:fp16", "fp16"), ("AUTO: dgc", "dgc"),
                                         ("topk:ratio=0.01", None), ("none", None)])
def test_split_spec(spec, inner):
    assert split_spec(spec) == inner


@pytest.mark.parametrize("spec", ["auto", "auto:", "auto: ", "auto:auto:topk", "auto:none",
                                  "auto:nosuch", "auto:topk:k=1", "auto:topk:ratio"])
def test_bad_spellings_list_the_valid_forms(spec):
    with pytest.raises(ValueError) as info:
        split_spec(spec)
    assert AUTO_FORMS in str(info.value) and repr(spec) in str(info.value)


def _file(path, codecs):
    path.write_text(json.dumps({"format": tuning_file.FORMAT, "version": tuning_file.VERSION,
                                "world_sizes": {}, "codecs": codecs}))
    return path


def test_tuning_file_codecs_are_read_checked_and_merged(tmp_path):
    path = _file(tmp_path / "t.json", {"topk:ratio=0.01": {"encode": 1e-9, "decode": 2e-10,
                                                           "payload": 3e-9, "ranks": 4}})
    assert tuning_file.read_codec_speeds(path) == {
        "topk:ratio=0.01": {"encode": 1e-9, "decode": 2e-10, "payload": 3e-9}}
    entry = {"rules": [{"max_bytes": None, "algorithm": "ring"}]}
    tuning_file.write(path, {2: entry}, codecs={"fp16": {"encode": 1.0, "decode": 0.0,
                                                         "payload": 0.0}})
    tuning_file.write(path, {4: entry})  # a later world size keeps the codecs
    assert set(tuning_file.read_codec_speeds(path)) == {"topk:ratio=0.01", "fp16"}
    assert set(tuning_file.read(path)) == {2, 4}
    for bad in ({"topk": {"encode": -1, "decode": 0, "payload": 0}},
                {"topk": {"encode": "fast", "decode": 0, "payload": 0}},
                {"topk": {"decode": 0, "payload": 0}}, {"topk": 3}, [1]):
        with pytest.raises(tuning_file.TuningFileError, match="codecs"):
            tuning_file.read_codec_speeds(_file(tmp_path / "bad.json", bad))


def test_a_codecs_speed_is_its_spec_else_its_name_else_built_in():
    table = {"topk:ratio=0.5": {"encode": 1.0, "decode": 1.0, "payload": 1.0},
             "topk:ratio=0.01": {"encode": 2.0, "decode": 2.0, "payload": 2.0},
             "dgc:density=0.5": {"encode": 3.0, "decode": 3.0, "payload": 3.0}}
    assert _speed_for(compress.get("topk", ratio=0.01), table).encode == 2.0
    other = _speed_for(compress.get("topk", ratio=0.2), table)
    assert other.encode == 1.0 and "other parameters" in other.source
    assert _speed_for(compress.get("fp16"), table) == DEFAULT_SPEEDS["fp16"]
    assert _speed_for(compress.get("qsgd"), table) == DEFAULT_SPEEDS["*"]


def test_error_feedback_flush_sends_the_residual_and_forgets_it():
    ef = compress.ErrorFeedback(compress.get("topk", ratio=0.25))
    x = np.array([-0.0, 1.0, -2.0, 3.0], np.float32)
    assert ef.flush(x, key="k") is x  # nothing held back: x itself, -0.0 kept
    ef.encode(np.array([4.0, 1.0, 2.0, 0.5], np.float32), key="k")  # sends 4, keeps the rest
    e = ef.residual("k")
    np.testing.assert_array_equal(ef.flush(x, key="k"), x + e)
    assert ef.residual("k") is None
    ef.encode(np.array([4.0, 1.0, 2.0, 0.5], np.float32), key="k")
    with np.errstate(over="ignore", invalid="ignore"):
        bad = ef.flush(np.array([np.inf, 0, 0, 0], np.float32), key="k")
    assert np.isinf(bad[0]) and ef.residual("k") is not None  # a skipped step keeps it


def test_dgc_memory_flush_is_dgc_at_density_one():
    mem = compress.DGCMemory(compress.get("dgc", density=0.25, seed=0), momentum=0.5)
    g = np.array([4.0, 1.0, 2.0, 0.5], np.float32)
    np.testing.assert_array_equal(mem.flush(g, key="k"), g)
    mem.encode(g, key="k")
    u, v = mem.state["k"].u.copy(), mem.state["k"].v.copy()
    np.testing.assert_array_equal(mem.flush(g, key="k"), v + (0.5 * u + g))
    assert "k" not in mem.state


def test_state_checks_auto():
    codec = compress.get("topk")
    with pytest.raises(TypeError, match="AutoCompression"):
        CompressionState(codec, auto="yes")

    class Holding(compress.protocols.Memory):  # a memory a dense step cannot flush
        def __init__(self, codec):
            self.codec, self.state = codec, {}

        def encode(self, x, *, key=None, step=0):
            return self.codec.encode(x)

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    with pytest.raises(ValueError, match="flush"):
        CompressionState(codec, Holding(codec), auto=AutoCompression())
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="margin"):
            AutoCompression(margin=bad)


def test_one_rank_sends_dense_and_reports_it():
    state = CompressionState.of(compress.get("topk", ratio=0.01), error_feedback=True)
    state.auto = AutoCompression()
    x = np.arange(1000, dtype=np.float32)
    y = collectives.compressed_allreduce(x, state, key="layer", comm=MPI.COMM_SELF)
    np.testing.assert_array_equal(y, x)  # one rank: nothing to save, dense
    report = state.auto.report()
    assert "layer" in report and "dense" in report and "built-in" in report
    assert "1 node of 1 ranks" in report.splitlines()[0]


def test_the_driver_takes_auto():
    cfg = parse(["--codec", "auto:topk:ratio=0.01"], 2, 1000)
    assert cfg.codec_name == "topk"
    state = CompressionState.from_spec(cfg.args.codec, error_feedback=None, seed=0, rank=0)
    assert isinstance(state.auto, AutoCompression) and state.error_feedback is not None
    with pytest.raises(UsageError, match="valid forms"):
        parse(["--codec", "auto"], 2, 1000)


def test_the_torch_entry_points_take_auto():
    pytest.importorskip("torch")
    from collectives.torch._common import make_state

    state = make_state("auto:topk:ratio=0.01", None, rank=0)
    assert isinstance(state.auto, AutoCompression) and state.error_feedback is not None
    with pytest.raises(ValueError, match="valid forms"):
        make_state("auto:", None, rank=0)


@pytest.mark.parametrize("spec", ["topk:ratio=0.1", "fp16"])
def test_measure_speed_gives_seconds_per_byte(spec):
    from collectives.compressed.speed import measure_speed

    speed = measure_speed(spec, 20000, 3, repeats=1)
    values = (speed.encode, speed.decode, speed.payload)
    assert all(0 <= v < 1e-5 for v in values) and speed.encode > 0 and speed.source == "measured"
