"""Serial tests of tuning files and of auto's use of them (COMM_SELF stands in for a world)."""

import json
import math
import warnings

import pytest
from mpi4py import MPI

from collectives import tuning
from collectives._context import Context
from collectives.algorithms.auto import builtin_choice, choose, comm_rules

RULES = [{"max_bytes": 4096, "algorithm": "native"}, {"max_bytes": None, "algorithm": "ring"}]


def _file(tmp_path, world_sizes, **extra):
    path = tmp_path / "tuning.json"
    data = {"format": tuning.FORMAT, "version": tuning.VERSION, "world_sizes": world_sizes,
            **extra}
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def use(monkeypatch):
    def point_at(path):
        monkeypatch.setenv(tuning.ENV, str(path))
        tuning.clear_cache()
    yield point_at
    tuning.clear_cache()


def test_read_valid(tmp_path):
    table = tuning.read(_file(tmp_path, {"4": {"rules": RULES}, "8": {"rules": RULES[1:]}}))
    assert table == {4: [(4096, "native"), (math.inf, "ring")], 8: [(math.inf, "ring")]}


@pytest.mark.parametrize("content, message", [
    ("{oops", "not readable as JSON"),
    ('{"format": "other"}', "not a tuning file"),
    ('{"format": "collectives-tuning", "version": 99, "world_sizes": {}}', "version 99"),
    ('{"format": "collectives-tuning", "version": 1, "world_sizes": []}', "world_sizes"),
])
def test_read_malformed_file(tmp_path, content, message):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(tuning.TuningFileError, match=message):
        tuning.read(path)


@pytest.mark.parametrize("rules, message", [
    ([], "non-empty"),
    ([{"max_bytes": None, "algorithm": "warp"}], "unknown algorithm 'warp'"),
    ([{"max_bytes": 64, "algorithm": "ring"}], "last rule"),
    ([{"max_bytes": 64, "algorithm": "ring"}, {"max_bytes": 64, "algorithm": "tree"},
      {"max_bytes": None, "algorithm": "ring"}], "larger"),
    ([{"max_bytes": None, "algorithm": "ring"}, {"max_bytes": None, "algorithm": "tree"}],
     "only the last"),
    ([{"algorithm": "ring"}], "max_bytes"),
])
def test_read_malformed_rules(tmp_path, rules, message):
    with pytest.raises(tuning.TuningFileError, match=message):
        tuning.read(_file(tmp_path, {"4": {"rules": rules}}))


def test_bad_world_size_key(tmp_path):
    with pytest.raises(tuning.TuningFileError, match="positive integers"):
        tuning.read(_file(tmp_path, {"four": {"rules": RULES}}))


def test_paths(monkeypatch, tmp_path):
    monkeypatch.delenv(tuning.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuning.tuning_path() == tmp_path / "collectives" / "tuning.json"
    for off in ("", "none", "OFF"):
        monkeypatch.setenv(tuning.ENV, off)
        assert tuning.tuning_path() is None
    monkeypatch.setenv(tuning.ENV, str(tmp_path / "x.json"))
    assert tuning.tuning_path() == tmp_path / "x.json"


def test_rules_for_missing_and_untuned(tmp_path, use):
    use(tmp_path / "absent.json")
    assert tuning.rules_for(4) is None
    use(_file(tmp_path, {"4": {"rules": RULES}}))
    assert tuning.rules_for(4) == [(4096, "native"), (math.inf, "ring")]
    assert tuning.rules_for(3) is None


def test_rules_for_is_read_once(tmp_path, use):
    path = _file(tmp_path, {"4": {"rules": RULES}})
    use(path)
    assert tuning.rules_for(4)
    path.write_text("{broken")
    assert tuning.rules_for(4)  # cached
    tuning.clear_cache()
    with pytest.raises(tuning.TuningFileError):
        tuning.rules_for(4)


def test_make_rules_thresholds_and_merging():
    rules = tuning.make_rules({8: "native", 512: "native", 8192: "recursive_doubling",
                               1 << 20: "rabenseifner"})
    assert rules[0] == {"max_bytes": int(math.sqrt(512 * 8192)), "algorithm": "native"}
    assert rules[1]["max_bytes"] == int(math.sqrt(8192 * (1 << 20)))
    assert rules[2] == {"max_bytes": None, "algorithm": "rabenseifner"}
    assert [r["algorithm"] for r in rules] == ["native", "recursive_doubling", "rabenseifner"]


def test_write_merges_world_sizes(tmp_path):
    path = tmp_path / "sub" / "t.json"
    tuning.write(path, {2: {"rules": RULES}}, host="a")
    tuning.write(path, {4: {"rules": RULES[1:]}}, host="b")
    table = tuning.read(path)
    assert set(table) == {2, 4} and json.loads(path.read_text())["host"] == "b"


def test_choose_with_and_without_rules():
    rules = [(4096, "native"), (math.inf, "ring")]
    assert choose(4096, 1024, 4, rules) == "native"
    assert choose(4097, 1024, 4, rules) == "ring"
    assert choose(1 << 20, 1 << 18, 4) == builtin_choice(1 << 20, 1 << 18, 4) == "rabenseifner"


def test_shm_only_on_one_node(tmp_path):
    """shm wherever all ranks share a node; a tuned rule naming it falls back elsewhere."""
    path = tuning.write(tmp_path / "t.json", {2: {"rules": [{"max_bytes": None,
                                                               "algorithm": "shm"}]}})
    assert tuning.read(path) == {2: [(math.inf, "shm")]}
    for nbytes in (8, 1 << 20):
        assert choose(nbytes, nbytes // 4, 4, one_node=True) == "shm"
        assert choose(nbytes, nbytes // 4, 4) != "shm"
    rules = [(4096, "native"), (math.inf, "shm")]
    assert choose(1 << 20, 1 << 18, 4, rules, one_node=True) == "shm"
    assert choose(1 << 20, 1 << 18, 4, rules) == "rabenseifner"
    assert choose(64, 16, 4, rules) == "native"


def test_comm_rules_falls_back_with_one_warning(tmp_path, use):
    path = tmp_path / "t.json"
    path.write_text("[1, 2")
    use(path)
    ctx = Context(MPI.COMM_SELF)
    try:
        with pytest.warns(RuntimeWarning, match="ignoring the tuning file"):
            assert comm_rules(ctx) is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert comm_rules(ctx) is None  # cached: no second read, no second warning
    finally:
        ctx.free()


def test_comm_rules_reads_file(tmp_path, use):
    use(_file(tmp_path, {"1": {"rules": RULES}}))
    ctx = Context(MPI.COMM_SELF)
    try:
        assert comm_rules(ctx) == [(4096, "native"), (math.inf, "ring")]
    finally:
        ctx.free()


def test_tune_keeps_builtin_choice_within_margin():
    from collectives.tuning.tune import pick
    times = {"native": 10.4, "ring": 20.0, "recursive_doubling": 10.0}
    assert pick(times, "native", 0.05) == "native"
    assert pick(times, "native", 0.01) == "recursive_doubling"
    assert pick({"native": 30.0, "rabenseifner": 20.0}, "native", 0.05) == "rabenseifner"
