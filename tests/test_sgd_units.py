"""Serial unit tests of the SGD driver's parts: model, fusion, schedule, data, codecs, checkpoint."""

import numpy as np
import pytest

import compress
from collectives import CompressionState
from collectives.sgd import checkpoint, data, datasets
from collectives.sgd.cli import UsageError, parse
from collectives.sgd import sync
from collectives.sgd.fusion import FusionBuffer
from collectives.sgd.model import MLP
from collectives.sgd.optim import SGD, Schedule


def test_fusion_views_share_the_buffer():
    fb = FusionBuffer([(2, 3), (3,), (4,)])
    assert fb.size == 13 and all(v.base is fb.flat for v in fb.views)
    arrays = [np.full((2, 3), 1.0), np.full(3, 2.0), np.full(4, 3.0)]
    flat = fb.pack(arrays)
    assert flat.tolist() == [1.0] * 6 + [2.0] * 3 + [3.0] * 4
    assert all(np.array_equal(a, b) for a, b in zip(fb.unpack(), arrays))
    with pytest.raises(ValueError):
        fb.pack(arrays[:2])


def test_mlp_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    m = MLP((5, 7, 3), seed=3)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = rng.integers(0, 3, 6)
    m.loss_and_grad(x, y)
    grad = m.grads.flat.copy()
    eps = 1e-2
    for i in rng.choice(m.params.size, 12, replace=False):
        keep = m.params.flat[i]
        m.params.flat[i] = keep + eps
        up = m.loss_and_grad(x, y)[0]
        m.params.flat[i] = keep - eps
        down = m.loss_and_grad(x, y)[0]
        m.params.flat[i] = keep
        assert (up - down) / (2 * eps) == pytest.approx(grad[i], abs=2e-3)


def test_he_init_scale_and_determinism():
    a, b = MLP((400, 300, 10), seed=5), MLP((400, 300, 10), seed=5)
    assert np.array_equal(a.params.flat, b.params.flat)
    assert a.layers[0][0].std() == pytest.approx(np.sqrt(2 / 400), rel=0.05)
    assert not a.layers[0][1].any()


def test_schedule_linear_scaling_warmup_and_decay():
    s = Schedule(base_lr=0.1, global_batch=512, warmup_steps=10, total_steps=110)
    assert s.peak == pytest.approx(0.2)
    assert s(0) == pytest.approx(0.02) and s(9) == pytest.approx(0.2)
    assert s(60) == pytest.approx(0.1) and s(109) < 1e-3


def test_sgd_momentum_update():
    p = np.ones(3, np.float32)
    opt = SGD(p, momentum=0.5)
    opt.step(np.ones(3, np.float32), lr=0.1)
    opt.step(np.ones(3, np.float32), lr=0.1)
    assert np.allclose(p, 1 - 0.1 * 1 - 0.1 * 1.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 100_003])
@pytest.mark.parametrize("weight_decay", [0.0, 5e-4])
def test_sgd_kernel_equals_numpy_bit_for_bit(dtype, n, weight_decay):
    """The one-pass kernel against NumPy's six passes, three steps, non-finite values included
    (weight decay 0 skips the term, so an inf parameter does not turn a gradient into NaN)."""
    rng = np.random.default_rng(n)
    p0 = rng.standard_normal(n).astype(dtype)
    if n > 1:
        p0[1] = np.inf
    kernel, ref = SGD(p0.copy(), 0.9, weight_decay), SGD(p0.copy(), 0.9, weight_decay)
    for step in range(3):
        g = rng.standard_normal(n).astype(dtype) * dtype(10.0 ** step)
        if n > 7:
            g[5] = np.nan
        kernel.step(g.copy(), lr=0.1 / (step + 1))
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: NaN, as the kernel
            ref.step_numpy(g.copy(), lr=0.1 / (step + 1))
        assert kernel.params.tobytes() == ref.params.tobytes(), step
        assert kernel.velocity.tobytes() == ref.velocity.tobytes(), step


@pytest.mark.parametrize("world", [1, 3, 4, 7])
def test_shards_are_disjoint_equal_and_deterministic(world):
    parts = [data.shard(100, world, r, seed=2, epoch=3) for r in range(world)]
    assert len({len(p) for p in parts}) == 1
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat) == (100 // world) * world
    assert np.array_equal(parts[0], data.shard(100, world, 0, seed=2, epoch=3))
    assert not np.array_equal(parts[0], data.shard(100, world, 0, seed=2, epoch=4))


def test_digits_split():
    ds = datasets.load("digits")
    assert ds.x_train.dtype == np.float32 and ds.features == 64 and ds.classes == 10
    assert len(ds.y_train) + len(ds.y_test) == 1797 and ds.x_train.max() <= 1
    assert len(datasets.load("digits", subset=100).y_train) == 100


def test_synthetic_data_is_generated_the_same_everywhere():
    ds = datasets.load("synthetic")
    assert ds.x_train.dtype == np.float32 and ds.features == 64 and ds.classes == 10
    assert len(ds.y_train) == 16000 and len(ds.y_test) == 4000
    assert ds.x_train.min() >= 0 and ds.x_train.max() <= 1
    assert np.bincount(ds.y_train).min() > 1400  # balanced classes
    x, y = datasets.DATASETS["synthetic"].__wrapped__()  # generated again, not the cached copy
    assert np.array_equal(x, datasets.DATASETS["synthetic"]()[0])
    assert np.array_equal(y, datasets.DATASETS["synthetic"]()[1])


@pytest.mark.parametrize("spec, expected", [
    ("topk", ("topk", {})),
    ("topk:ratio=0.01", ("topk", {"ratio": 0.01})),
    ("qsgd:levels=4,x=true,y=abc", ("qsgd", {"levels": 4, "x": True, "y": "abc"})),
    ("topk:ratio=1", ("topk", {"ratio": 1.0})),
])
def test_parse_spec(spec, expected):
    assert compress.parse_spec(spec) == expected


def test_parse_spec_rejects_garbage():
    with pytest.raises(ValueError, match="key=value"):
        compress.parse_spec("topk:ratio")


def test_seeding_private_differs_shared_agrees():
    q = [CompressionState.from_spec("qsgd", error_feedback=None, seed=0, rank=r)
         for r in range(2)]
    assert q[0].generator.integers(1 << 30) != q[1].generator.integers(1 << 30)
    assert q[0].error_feedback is None
    k = [CompressionState.from_spec("randomk:ratio=0.1", error_feedback=None, seed=4,
                                    rank=r) for r in range(2)]
    assert k[0].codec.seed == k[1].codec.seed == 4 and k[0].error_feedback is not None
    topk = CompressionState.from_spec("topk", error_feedback=False, seed=0, rank=0)
    assert topk.error_feedback is None


def test_overlap_buckets_cover_the_gradient_in_backward_order():
    from collectives.sgd.sync import Buckets
    from collectives.sgd.model import MLP

    m = MLP((5, 7, 3), seed=0)
    b = Buckets(m.grads, bucket_bytes=2 * 7 * 4)  # 2 rows of the 5x7 weight, 4 of the 7x3
    assert [[(r.start, r.stop) for r in rows] for rows in b.rows] == [[(0, 2), (2, 4), (4, 5)],
                                                                      [(0, 4), (4, 7)]]
    covered = np.zeros(m.grads.size, int)
    for views in b.views:
        for v in views:
            assert np.shares_memory(v, m.grads.flat)
            start = (v.__array_interface__["data"][0] - m.grads.flat.__array_interface__["data"][0])
            covered[start // 4:start // 4 + v.size] += 1
    assert (covered == 1).all()  # every gradient element in exactly one bucket
    matrices = Buckets(m.grads, bucket_bytes=2 * 7 * 4, matrices=True)  # layerwise codecs
    covered[:] = 0
    for parts in matrices.parts:
        for part in parts:
            for key, a in part:
                assert np.shares_memory(a, m.grads.flat) and a.base is not None
                start = (a.__array_interface__["data"][0]
                         - m.grads.flat.__array_interface__["data"][0])
                covered[start // 4:start // 4 + a.size] += 1
                assert a.ndim == (1 if key.endswith(".bias") else 2), (key, a.shape)
    assert (covered == 1).all()
    assert [key for key, _ in matrices.parts[0][2]] == ["grads.0.2", "grads.0.2.bias"]
    ready = []
    x = np.random.default_rng(0).random((4, 5), dtype=np.float32)
    m.loss_and_grad(x, np.array([0, 1, 2, 0]), on_ready=lambda i, k: ready.append((i, k)),
                    row_blocks=b.row_blocks)
    assert ready == [(1, 0), (1, 1), (0, 0), (0, 1), (0, 2)]  # last layer first, rows in order
    fused = MLP((5, 7, 3), seed=0)
    fused.loss_and_grad(x, np.array([0, 1, 2, 0]))
    assert np.allclose(fused.grads.flat, m.grads.flat, rtol=1e-6, atol=1e-7)


def test_sync_and_bytes():
    def value(text, world=4):
        cls, v = sync.parse(text, world)
        return cls.name, v

    assert value("sync") == ("sync", None) and value("local:8") == ("local", 8)
    assert sync.Local.every(8) == 8 and sync.Synchronous.every(None) == 0
    assert value("gossip:ring")[0] == "gossip"
    assert value("gossip:one_peer_exponential", 5)[1].period == 3
    assert value("gossip:torus:metropolis", 6)[1].name == "torus(2x3)"
    assert parse(["--sync", "gossip:ring:metropolis"], 5, 1437).gossip == "ring(5)"
    assert value("ssp:0") == ("ssp", 0) and value("async") == ("async", None)
    assert value("sgp") == ("sgp", False) and value("sgp:overlap") == ("sgp", True)
    assert value("adpsgd")[1].name == "ring(4)"
    for bad in ("local", "local:0", "asynchronous", "ssp:-1", "ssp:x", "ssp", "sgp:x", "sync:1",
                "async:", "gossip", "local:2x"):
        with pytest.raises(ValueError, match="--sync must be 'sync', 'local:H'"):
            sync.parse(bad, 4)
    with pytest.raises(ValueError, match="^--sync adpsgd:one_peer_exponential: .* changes every"):
        sync.parse("adpsgd:one_peer_exponential", 4)
    assert sync.ring_bytes(400, 4) == 600 and sync.ring_bytes(400, 1) == 0


#: argument lists that select each mode (and its variants); the table must cover them all
MODE_EXAMPLES = {
    "sync": [[], ["--codec", "topk"], ["--overlap"]],
    "local": [["--sync", "local:2"]],
    "gossip": [["--sync", "gossip:ring"], ["--sync", "gossip:ring", "--codec", "topk"],
               ["--sync", "gossip:nodes"], ["--sync", "gossip:ring", "--overlap"]],
    "sgp": [["--sync", "sgp"], ["--sync", "sgp:overlap"]],
    "adpsgd": [["--sync", "adpsgd"], ["--sync", "adpsgd:torus"]],
    "ssp": [["--sync", "ssp:0"], ["--sync", "ssp:3"]],
    "async": [["--sync", "async"]],
}


def test_the_mode_table_and_the_parser_agree():
    """Every mode of the table is accepted by --sync (and selects its class); every flag a mode
    refuses, added to an accepted command line, raises that mode's message; every flag the
    table knows that a mode does not refuse is accepted (by its plain form); the syntax
    message names every mode."""
    assert sorted(MODE_EXAMPLES) == sorted(sync.MODES)
    with pytest.raises(UsageError) as bad:
        parse(["--sync", "nope"], 4, 1437)
    assert all(cls.forms in str(bad.value) for cls in sync.MODES.values())
    refused_somewhere = set()
    for name, examples in MODE_EXAMPLES.items():
        for argv in examples:
            cfg = parse(argv, 4, 1437)
            assert cfg.mode is sync.MODES[name], argv
            _, value = sync.parse(cfg.args.sync, 4)
            refusals = sync.refusals(cfg.mode, value, cfg.choco)
            refused = {flag for r in refusals for flag in r.flags}
            refused_somewhere |= refused
            for r in refusals:
                for flag in r.flags:
                    extra = list(sync.FLAGS[flag].example)
                    with pytest.raises(UsageError) as e:
                        parse([*argv, *extra], 4, 1437)
                    want = r.message.format(sync=cfg.args.sync)
                    assert str(e.value) == want, (argv, flag)
            for flag in set(sync.FLAGS) - refused if argv[2:] == [] else ():  # (not variants)
                cfg2 = parse([*argv, *sync.FLAGS[flag].example], 4, 1437)  # accepted
                assert cfg2.mode is cfg.mode
    assert refused_somewhere == set(sync.FLAGS)  # every flag of the table is refused somewhere
    # a mode's value errors name the --sync value; a mode's own check has its message
    with pytest.raises(UsageError, match="multiple of 2"):
        parse(["--sync", "local:2", "--checkpoint-dir", "d", "--checkpoint-every", "3"], 4, 1437)


@pytest.mark.parametrize("argv, message", [
    (["--codec", "nope"], "unknown codec"),
    (["--batch-size", "0"], "positive integer"),
    (["--batch-size", "500"], "exceeds"),
    (["--sync", "local:0"], "local:H"),
    (["--codec", "topk", "--sync", "local:2"], "does not exchange"),
    (["--resume"], "--checkpoint-dir"),
    (["--log", "x.txt"], ".csv or .json"),
    (["--algorithm", "bogus"], "invalid choice"),
    (["--codec", "topk:k=5"], "--codec topk:k=5: topk has no parameter 'k'; its parameters are: "
                              "ratio$"),
    (["--codec", "qsgd:levels=x"], "qsgd parameter 'levels' takes an integer, got 'x'"),
    (["--codec", "qsgd:seed=x"], "qsgd parameter 'seed' takes an integer"),
    (["--overlap", "--sync", "local:2"], "--sync local:H exchanges none"),
    (["--sync", "gossip:star"], "--sync gossip:star: unknown graph 'star'; valid choices: ring"),
    (["--sync", "gossip:exponential:metropolis"], "needs an undirected graph"),
    (["--sync", "gossip:ring:max"], "unknown weights 'max'"),
    (["--sync", "gossip:ring", "--codec", "topk", "--error-feedback"], "is CHOCO-SGD"),
    (["--sync", "gossip:ring", "--check-replicas"], "--sync gossip exchanges parameters"),
    (["--sync", "gossip:ring", "--codec", "topk", "--overlap"], "--overlap mixes the parameters"),
    (["--sync", "ssp:x"], "'ssp:S' with an integer S >= 0 or 'async'"),
    (["--sync", "ssp:1", "--codec", "topk"], "--sync ssp:1 pushes updates to a parameter server"),
    (["--sync", "async", "--check-replicas"], "--sync async pushes updates"),
    (["--sync", "sgp", "--overlap"], "--sync sgp exchanges parameters"),
    (["--sync", "gossip:ring", "--check-replicas"], "its replicas differ"),
    (["--overlap", "--bucket-mb", "0"], "--bucket-mb must be positive"),
    (["--gossip-dtype", "float16"], "--gossip-dtype sends the parameters of a plain gossip"),
    (["--sync", "gossip:ring", "--codec", "topk", "--gossip-dtype", "float16"], "not with --codec"),
    (["--sync", "gossip:nodes", "--gossip-dtype", "float16"], "or gossip:nodes"),
    (["--sync", "gossip:ring", "--gossip-dtype", "bfloat16"], "invalid choice"),
    (["--momentum-correction"], "need a --codec"),
    (["--dense-steps", "5"], "need a --codec"),
    (["--codec", "dgc", "--momentum-correction", "--error-feedback"], "replaces --error-feedback"),
    (["--codec", "dgc", "--sparsity-warmup", "4"], "options of --momentum-correction"),
    (["--codec", "dgc", "--clip", "1"], "options of --momentum-correction"),
    (["--codec", "qsgd", "--momentum-correction", "--sparsity-warmup", "4"], "dgc or topk"),
    (["--codec", "dgc", "--momentum-correction", "--clip", "0"], "--clip must be a positive"),
    (["--codec", "dgc", "--momentum-correction", "--clip", "inf"], "--clip must be a positive"),
])
def test_cli_rejects(argv, message):
    with pytest.raises(UsageError, match=message):
        parse(argv, world=4, n_train=1437)


def test_cli_world_larger_than_data():
    with pytest.raises(UsageError, match="world size 9 exceeds the 8"):
        parse(["--subset", "8", "--batch-size", "1"], world=9, n_train=1437)


def test_atomic_write_and_read(tmp_path):
    (tmp_path / ".checkpoint-stale.tmp").write_bytes(b"half")
    path = str(tmp_path / checkpoint.FILENAME)
    checkpoint.write_atomic(path, {"a": np.arange(3), "meta": np.array("{}")})
    got = checkpoint.read(path)
    assert got["a"].tolist() == [0, 1, 2] and str(got["meta"]) == "{}"
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.FILENAME]


@pytest.mark.parametrize("damage", ["garbage", "truncate", "missing"])
def test_read_damaged_checkpoint(tmp_path, damage):
    path = tmp_path / checkpoint.FILENAME
    checkpoint.write_atomic(str(path), {"a": np.arange(1000)})
    blob = path.read_bytes()
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(b"not a zip" if damage == "garbage" else blob[: len(blob) // 2])
    with pytest.raises(ValueError, match="checkpoint"):
        checkpoint.read(str(path))


def test_codec_time_splits_into_encode_and_decode_counting_nested_calls_once():
    """time_methods: a decode called inside an encode (error feedback reading its own payload)
    counts once, in the outermost call's part, so encode + decode is the codec's time."""
    import time

    from collectives.sgd.timing import Clock, time_methods

    class Codec:
        def encode(self, x):
            time.sleep(0.02)
            return self.decode(x)

        def decode(self, x):
            time.sleep(0.01)
            return x

    clock, codec = Clock(), Codec()
    time_methods(codec, clock, "codec")
    codec.encode(1)  # about 30 ms, all of it encoding
    codec.decode(1)  # about 10 ms of decoding
    t = clock.seconds
    assert t["encode"] + t["decode"] == pytest.approx(t["codec"], rel=1e-9)
    assert t["encode"] >= 0.03 and 0.01 <= t["decode"] < 0.03, dict(t)


def test_plot_names_each_run_and_starts_its_time_axes_at_zero(tmp_path, capsys):
    """The training plot: the legend says what each run was ("dense ring", not "none ring"),
    the wall-time axes start at the start of training, and the command says what it wrote."""
    pytest.importorskip("matplotlib")
    from collectives.sgd import report

    recs = [{"epoch": e, "loss": 1.0 / e, "test_acc": 0.5 + 0.1 * e, "wall_s": 0.55 * e,
             "consensus": 0.1 / e} for e in (1, 2, 3)]
    fig = report.figure({"dense ring": recs, "topk+ef ring": recs})
    try:
        by_time = [ax for ax in fig.axes if ax.get_xlabel() == "wall time (s)"]
        assert len(by_time) == 2 and all(ax.get_xlim()[0] == 0 for ax in by_time)
        legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
        assert legend == ["dense ring", "topk+ef ring"]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    out = tmp_path / "curves.png"
    assert report.main([str(out), *_logs(tmp_path, recs)]) == 0
    assert out.stat().st_size > 0 and capsys.readouterr().out.strip() == f"wrote {out}"


def _logs(tmp_path, recs):
    import json

    paths = []
    for label in ("dense ring", "topk+ef ring"):
        path = tmp_path / f"{label.split()[0]}.json"
        path.write_text(json.dumps({"summary": {"label": label}, "epochs": recs}))
        paths.append(str(path))
    return paths
