"""Serial tests of tuning files and of auto's use of them (COMM_SELF stands in for a world)."""

import json
import math
import warnings

import pytest
from mpi4py import MPI

from collectives import selection
from collectives._runtime.context import Context
from collectives.algorithms.auto import algorithm_for, builtin_choice, comm_rules

RULES = [{"max_bytes": 4096, "algorithm": "native"}, {"max_bytes": None, "algorithm": "ring"}]


def _file(tmp_path, world_sizes, **extra):
    path = tmp_path / "tuning.json"
    data = {"format": selection.FORMAT, "version": selection.VERSION, "world_sizes": world_sizes,
            **extra}
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def use(monkeypatch):
    def point_at(path):
        monkeypatch.setenv(selection.ENV, str(path))
        selection.clear_cache()
    yield point_at
    selection.clear_cache()


def test_read_valid(tmp_path):
    table = selection.read(_file(tmp_path, {"4": {"rules": RULES}, "8": {"rules": RULES[1:]}}))
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
    with pytest.raises(selection.TuningFileError, match=message):
        selection.read(path)


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
    with pytest.raises(selection.TuningFileError, match=message):
        selection.read(_file(tmp_path, {"4": {"rules": rules}}))


def test_bad_world_size_key(tmp_path):
    with pytest.raises(selection.TuningFileError, match="positive integers"):
        selection.read(_file(tmp_path, {"four": {"rules": RULES}}))


def test_paths(monkeypatch, tmp_path):
    monkeypatch.delenv(selection.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert selection.tuning_path() == tmp_path / "collectives" / "tuning.json"
    for off in ("", "none", "OFF"):
        monkeypatch.setenv(selection.ENV, off)
        assert selection.tuning_path() is None
    monkeypatch.setenv(selection.ENV, str(tmp_path / "x.json"))
    assert selection.tuning_path() == tmp_path / "x.json"


def test_rules_for_missing_and_untuned(tmp_path, use):
    use(tmp_path / "absent.json")
    assert selection.rules_for(4) is None
    use(_file(tmp_path, {"4": {"rules": RULES}}))
    assert selection.rules_for(4) == [(4096, "native"), (math.inf, "ring")]
    assert selection.rules_for(3) is None


def test_rules_for_is_read_once(tmp_path, use):
    path = _file(tmp_path, {"4": {"rules": RULES}})
    use(path)
    assert selection.rules_for(4)
    path.write_text("{broken")
    assert selection.rules_for(4)  # cached
    selection.clear_cache()
    with pytest.raises(selection.TuningFileError):
        selection.rules_for(4)


def test_make_rules_thresholds_and_merging():
    rules = selection.make_rules({8: "native", 512: "native", 8192: "recursive_doubling",
                               1 << 20: "rabenseifner"})
    assert rules[0] == {"max_bytes": int(math.sqrt(512 * 8192)), "algorithm": "native"}
    assert rules[1]["max_bytes"] == int(math.sqrt(8192 * (1 << 20)))
    assert rules[2] == {"max_bytes": None, "algorithm": "rabenseifner"}
    assert [r["algorithm"] for r in rules] == ["native", "recursive_doubling", "rabenseifner"]


def test_write_merges_world_sizes(tmp_path):
    path = tmp_path / "sub" / "t.json"
    selection.write(path, {2: {"rules": RULES}}, host="a")
    selection.write(path, {4: {"rules": RULES[1:]}}, host="b")
    table = selection.read(path)
    assert set(table) == {2, 4} and json.loads(path.read_text())["host"] == "b"


@pytest.mark.parametrize("old", ["[" * 100_000, json.dumps({"format": selection.FORMAT, "version":
                                  selection.VERSION, "world_sizes": {"\u00b2": {"rules": RULES}}})])
def test_write_replaces_a_hostile_file(tmp_path, old):
    """collectives-tune writing over a file it cannot use replaces it (it used to raise)."""
    path = tmp_path / "t.json"
    path.write_text(old)
    selection.write(path, {2: {"rules": RULES}})
    assert set(selection.read(path)) == {2}


def test_choose_with_and_without_rules():
    rules = [(4096, "native"), (math.inf, "ring")]
    assert algorithm_for(4096, 1024, 4, rules) == "native"
    assert algorithm_for(4097, 1024, 4, rules) == "ring"
    assert algorithm_for(1 << 20, 1 << 18, 4) == builtin_choice(1 << 20, 1 << 18, 4) \
        == "rabenseifner"


def test_shm_only_on_one_node(tmp_path):
    """shm wherever all ranks share a node; a tuned rule naming it falls back elsewhere."""
    path = selection.write(tmp_path / "t.json", {2: {"rules": [{"max_bytes": None,
                                                               "algorithm": "shm"}]}})
    assert selection.read(path) == {2: [(math.inf, "shm")]}
    for nbytes in (8, 1 << 20):
        assert algorithm_for(nbytes, nbytes // 4, 4, one_node=True) == "shm"
        assert algorithm_for(nbytes, nbytes // 4, 4) != "shm"
    rules = [(4096, "native"), (math.inf, "shm")]
    assert algorithm_for(1 << 20, 1 << 18, 4, rules, one_node=True) == "shm"
    assert algorithm_for(1 << 20, 1 << 18, 4, rules) == "rabenseifner"
    assert algorithm_for(64, 16, 4, rules) == "native"


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
    from collectives.tools.tuning.tune import fastest
    times = {"native": 10.4, "ring": 20.0, "recursive_doubling": 10.0}
    assert fastest(times, "native", 0.05) == "native"
    assert fastest(times, "native", 0.01) == "recursive_doubling"
    assert fastest({"native": 30.0, "rabenseifner": 20.0}, "native", 0.05) == "rabenseifner"


def test_entries_keep_nodes_and_model(tmp_path, use):
    model = {"alpha": 1e-6, "beta": 1e-10, "gamma": 1e-10, "alpha_inter": 5e-5,
             "beta_inter": 8e-9, "node_size": 2}
    rules = RULES[:1] + [{"max_bytes": None, "algorithm": "hierarchical"}]
    use(_file(tmp_path, {"4": {"rules": rules, "nodes": [2, 2], "model": model},
                         "2": {"rules": RULES}}))
    entry = selection.entry_for(4)
    assert entry.nodes == (2, 2) and entry.model == model
    assert entry.rules[-1] == (math.inf, "hierarchical")
    assert selection.entry_for(2).nodes is None and selection.entry_for(2).model is None


@pytest.mark.parametrize("nodes", [[2, 1], [], [2, "2"], [0, 4], "2,2", [True, 3]])
def test_bad_nodes(tmp_path, nodes):
    with pytest.raises(selection.TuningFileError, match="'nodes' must list"):
        selection.read(_file(tmp_path, {"4": {"rules": RULES, "nodes": nodes}}))


def test_shm_cma_bytes_read_and_checked(tmp_path, use):
    use(_file(tmp_path, {"2": {"rules": RULES, "shm_cma_bytes": 262144}, "4": {"rules": RULES}}))
    assert selection.entry_for(2).shm_cma_bytes == 262144
    assert selection.entry_for(4).shm_cma_bytes is None
    for bad in (-1, 1.5, "4M", True, [1]):
        with pytest.raises(selection.TuningFileError, match="'shm_cma_bytes' must be"):
            selection.read(_file(tmp_path, {"2": {"rules": RULES, "shm_cma_bytes": bad}}))


def test_cma_threshold_from_the_two_transfers():
    """collectives-tune's shm threshold: where cross-memory attach starts winning by more than
    the margin and never loses by more than it above; above any call where the slots win at the
    largest size; None (the built-in threshold) where neither wins anywhere."""
    from collectives.tools.tuning.tune import CMA_COLUMNS, cma_threshold

    slots, cma = CMA_COLUMNS
    never = CMA_COLUMNS[slots]

    def times(*pairs):
        sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20]
        return {s: {slots: a, cma: b} for s, (a, b) in zip(sizes, pairs)}

    t = times((10, 20), (100, 70), (400, 200), (1600, 800))
    assert cma_threshold(t, 0.05, 64 << 10) == 256 << 10  # the first size above replication
    assert cma_threshold(t, 0.05, 0) == int(((64 << 10) * (256 << 10)) ** 0.5)
    t = times((10, 20), (100, 99), (400, 300), (1600, 800))
    assert cma_threshold(t, 0.05, 0) == 1 << 19  # 256 KiB within the margin: from between
    t = times((10, 20), (100, 70), (400, 450), (1600, 800))
    assert cma_threshold(t, 0.05, 0) == 2 << 20  # the slots win at 1 MiB: after it
    assert cma_threshold(times((10, 20), (100, 70), (400, 300), (1600, 1800)), 0.05, 0) == never
    assert cma_threshold(times((10, 10.2), (100, 99), (400, 401), (1600, 1599)), 0.05, 0) is None
    assert cma_threshold({}, 0.05, 0) is None


def test_bad_model(tmp_path):
    with pytest.raises(selection.TuningFileError, match="'model' must be an object"):
        selection.read(_file(tmp_path, {"4": {"rules": RULES, "model": [1, 2]}}))


def test_choose_with_a_two_level_model():
    """Across nodes on a slow network, the model sends large messages through hierarchical."""
    from collectives.selection.cost_model import Network
    from collectives.selection.network import CLUSTER_DEFAULTS

    slow = Network(**{**CLUSTER_DEFAULTS, "beta_inter": 8e-9, "alpha_inter": 1e-4,
                      "node_size": 4})
    assert algorithm_for(1 << 10, 256, 16, None, slow) == "native"  # small: the built-in rule
    assert algorithm_for(64 << 20, 16 << 20, 16, None, slow) == "hierarchical"
    one_rank_nodes = Network(**{**CLUSTER_DEFAULTS, "node_size": 1})
    assert algorithm_for(64 << 20, 16 << 20, 16, None, one_rank_nodes) != "hierarchical"


def test_plan_on_one_node_follows_rules_or_builtin(tmp_path, use):
    from collectives.algorithms.auto import selector

    use(_file(tmp_path, {"1": {"rules": RULES, "nodes": [1]}}))
    ctx = Context(MPI.COMM_SELF)
    try:
        sel = selector(ctx)
        assert sel.nodes == [1] and sel.model is None
        assert sel.rules == [(4096, "native"), (math.inf, "ring")]
        assert sel.pick(1 << 20, 1 << 18) == "ring"
    finally:
        ctx.free()


def test_cluster_model_prefers_fitted_parameters():
    from collectives.selection.network import CLUSTER_DEFAULTS, cluster_model as _cluster_model

    fitted = selection.Entry(RULES, (2, 2), {"alpha": 2e-6, "beta": 1e-10, "gamma": 1e-10,
                                          "alpha_inter": 7e-5, "beta_inter": 8e-9,
                                          "node_size": 2})
    net = _cluster_model(fitted, [3, 1])
    assert net.alpha_inter == 7e-5 and net.node_size == 1  # the smallest node of this comm
    one_level = selection.Entry(RULES, None, {"alpha": 2e-6, "beta": 1e-10, "gamma": 1e-10})
    assert _cluster_model(one_level, [2, 2]).alpha_inter == CLUSTER_DEFAULTS["alpha_inter"]
    broken = selection.Entry(RULES, None, {"alpha_inter": 1.0, "bogus": 3})
    assert _cluster_model(broken, [2, 2]).alpha == CLUSTER_DEFAULTS["alpha"]


def test_tune_writes_the_measured_cma_threshold(tmp_path):
    """``collectives-tune`` at 2 ranks on one node: the shm allreduce's two transfers are timed
    at the sizes above replication only, and the file's ``shm_cma_bytes`` is what
    :func:`cma_threshold` makes of those times (absent where it makes None)."""
    import subprocess
    import sys

    from collectives.algorithms.shm import REPLICATE_BYTES
    from collectives.tools.tuning.tune import CMA_COLUMNS, cma_threshold

    out = tmp_path / "tuning.json"
    run = subprocess.run([sys.executable, "-m", "collectives.tools.tuning.tune", "--ranks", "2",
                          "--quick", "--sizes", "8,131072,262144", "--codec", "none", "--output",
                          str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    entry = json.loads(out.read_text())["world_sizes"]["2"]
    measured = {int(size): row for size, row in entry["measured_us"].items()}
    assert sorted(measured) == [8, 131072, 262144]
    assert not CMA_COLUMNS.keys() & measured[8].keys()
    assert all(CMA_COLUMNS.keys() <= measured[s].keys() for s in (131072, 262144))
    want = cma_threshold({s: measured[s] for s in (131072, 262144)}, 0.05, REPLICATE_BYTES)
    assert entry.get("shm_cma_bytes") == want
    if want is not None:
        assert f"p=2 shm: cross-memory attach from {want} B" in run.stdout
