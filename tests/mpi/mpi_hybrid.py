"""Hybrid parallelism in the SGD driver (``--mesh dp=A,pp=B,tp=C``): pipeline stages whose
hidden-layer pairs are split over ``tp``, replicas over ``dp``. The parameters after N steps
against the same model trained in one process on the same global batches, at dp2 x pp2,
pp2 x tp2, dp2 x tp2 (each with a singleton axis), pp4 and dp2 x pp2 x tp2, over a 5-layer
model that no pp of 2 or 4 divides; the report's per-axis communication; the shorthands as
mesh shapes; a mesh that does not match the world and a model that cannot be split, refused on
every rank; ``--codec`` and ``--shard 1`` on the dp axis; a bitwise resume.

Tolerance: the micro-batches' gradients and the row layers' partial products are summed in
another order than one batch's matrix products: after 3 steps the largest difference from the
one-process run, relative to the parameters' largest magnitude, stays below ``RTOL = 1e-6``
(measured at the meshes here: 1.9e-8 to 3.9e-8; float32's epsilon is 1.2e-7; also at 1 and 2
ranks, where one rank per axis gives 3.9e-8: its micro-batches' gradients add in another order
than one batch's).
"""


import numpy as np
import pytest
from mpi4py import MPI

from reference import one_process, shared_dir, trainer

from collectives._runtime.cli import UsageError
from collectives.sgd import main, train
from collectives.sgd.cli import parse
from collectives.sgd.model import MLP

# 1 rank (every axis a singleton), 2 (each axis alone), 4 (every pair of axes), 8 (all three)
pytestmark = pytest.mark.world_sizes(1, 2, 4, 8)

WORLD = MPI.COMM_WORLD
HIDDEN = (12, 10, 8, 6)  # 5 layers; the pairs (12 | 10) and (8 | 6) split by columns at 12, 8
BATCH = 8
RTOL = 1e-6

#: the meshes (dp, pp, tp) checked at each world size: at 4 ranks every pair of axes (the third
#: a singleton) and pp alone (two singletons); 1 and 2 ranks (every axis, or all but one, a
#: singleton) are mpi_pipeline.py's and mpi_tensor_parallel.py's shapes, and the shorthands'
#: test below shows they are these meshes
MESHES = {1: [(1, 1, 1)], 2: [(2, 1, 1), (1, 2, 1), (1, 1, 2)],
          4: [(2, 2, 1), (1, 2, 2), (2, 1, 2), (1, 4, 1)], 8: [(2, 2, 2)]}


def _spec(mesh):
    return ",".join(f"{k}={v}" for k, v in zip(("dp", "pp", "tp"), mesh))


def _argv(mesh, *extra):
    return ["--subset", str(24 * mesh[0]), "--epochs", "1", "--hidden",
            ",".join(map(str, HIDDEN)), "--batch-size", str(BATCH), "--lr", "4",
            "--weight-decay", "1e-3", "--quiet", "--mesh", _spec(mesh),
            "--micro-batches", str(mesh[1] + 1), *extra]


@pytest.mark.world_sizes(4, 8)
def test_hybrid_training_matches_one_process():
    """Every mesh of the world size (1F1B and GPipe in turn: the schedule does not change the
    bits, mpi_pipeline.py): the gathered parameters after 3 steps within RTOL of the one-process
    run on the global batches, the same on every rank; the replicas of every dp group bitwise
    alike (``--check-replicas``); the report's axes carry bytes exactly where the mesh has more
    than one rank."""
    for i, mesh in enumerate(MESHES[WORLD.size]):
        schedule = ("1f1b", "gpipe")[i % 2]
        t = trainer(_argv(mesh, "--schedule", schedule, "--check-replicas"), WORLD)
        try:
            assert t.train() and t.step == 3
            got = t.gather_params()
            s = t.summary()
        finally:
            t.close()
        ref = one_process(t)
        assert not np.array_equal(ref, MLP(t.sizes, seed=0).params.flat)  # it trained
        err = np.abs(got - ref).max() / np.abs(ref).max()
        assert err < RTOL, (mesh, err)
        for other in WORLD.allgather(got):
            assert np.array_equal(other, got)
        assert s["mesh"] == dict(zip(("dp", "pp", "tp"), mesh))
        for axis, n in zip(("dp", "pp", "tp"), mesh):
            assert (s["axes"][axis]["bytes_max"] > 0) == (n > 1), (mesh, axis, s["axes"])
        assert s["params"] == MLP(t.sizes).params.size
        p = s["pipeline"]
        assert len(p["per_stage"]) == mesh[1]
        for st in p["per_stage"]:
            assert 0 <= st["bubble"] <= 1 and st["peak_activation_bytes"] > 0


@pytest.mark.world_sizes(1, 2, 4)  # parsing alone: every rank alike
def test_shorthands_are_mesh_shapes():
    """``--pipeline S --tensor T`` is the mesh (W/(S T), S, T): the same configuration (and
    checkpoint fingerprint) as ``--mesh``; ``--tensor T`` alone (W/T, 1, T)."""
    W = WORLD.size
    for mesh in MESHES[W]:
        base = _argv(mesh)[:-4]
        short = parse([*base, "--pipeline", str(mesh[1]), "--tensor", str(mesh[2])], W, 10**6)
        full = parse([*base, "--mesh", _spec(mesh)], W, 10**6)
        assert short.mesh == full.mesh == mesh
        assert short.fingerprint_fields() == full.fingerprint_fields()
    assert parse(["--tensor", "1"], W, 10**6).mesh == (W, 1, 1)


@pytest.mark.world_sizes(1, 2, 4)  # the verdict is "on every rank": no need of 8
def test_bad_meshes_stop_every_rank():
    """A mesh that does not hold the world size, a bad spelling, a mesh beside a shorthand, a
    model that cannot be split (more stages than layers, a width tp does not divide), --shard or
    --codec on a mesh: the same UsageError on every rank, before any message (exit status 2
    from main, then the next run works)."""
    W = WORLD.size
    base = ["--hidden", ",".join(map(str, HIDDEN)), "--subset", "64", "--batch-size", "8",
            "--quiet", "--epochs", "1"]
    cases = [(["--mesh", f"dp={W},tp=2"], f"holds {2 * W} ranks, the world size is {W}"),
             (["--mesh", f"dp={W + 1}"], f"holds {W + 1} ranks, the world size is {W}"),
             (["--mesh", f"pp={W},pp=1"], "at most once"),
             (["--mesh", f"xp={W}"], "at most once"),
             (["--mesh", "dp=x"], "N a positive integer"),
             (["--mesh", "dp=0"], "must be a positive integer, got 0"),
             (["--mesh", f"dp={W}", "--pipeline", "1"], "shorthands"),
             (["--mesh", f"dp={W}", "--shard", "2"], "ZeRO stages 2 and 3"),
             (["--pipeline", "1", "--shard", "3"], "--shard 3 on a mesh \\(--pipeline\\)"),
             (["--mesh", f"dp={W}", "--codec", "topk:ratio=0.5", "--momentum-correction"],
              "does not take --momentum-correction"),
             (["--mesh", f"pp=1,dp={W}", "--hidden", "8"], None)]
    if W >= 2:
        cases += [(["--mesh", f"dp={W // 2},tp=2", "--hidden", "12,8,9,8"],
                   "tp=2 does not divide the hidden width 9"),
                  (["--mesh", f"dp={W // 2},tp=2", "--hidden", "7,7"],
                   "tp=2 does not divide the hidden width 7")]
    if W >= 4:
        cases.append((["--mesh", f"dp={W // 4},pp=4", "--hidden", "8,8"],
                      "4 pipeline stages, but the model has 3 layers"))
    for extra, message in cases:
        if message is None:  # a good one among them
            assert parse(base + extra, W, 64).mesh == (W, 1, 1)
            continue
        with pytest.raises(UsageError, match=message):
            parse(base + extra, W, 64)
        assert main(base + extra, WORLD) == 2
    assert train([*base, "--mesh", f"dp={W}"], WORLD) is not None


@pytest.mark.world_sizes(4)
def test_codec_compresses_the_dp_exchange():
    """dp2 x pp2 with ``--codec``: each shard's dp exchange compressed. fp16 (no memory) sends
    half the dense run's bytes over dp and nothing else changes on the other axes; its
    parameters differ from the dense run's (it was applied) by fp16's rounding at most; topk
    with error feedback, stopped and resumed, ends with the bits of the run that never stopped
    (every rank's residual of its shard in the checkpoint)."""
    mesh = (2, 2, 1)
    runs = {}
    for codec in ("none", "fp16"):
        t = trainer(_argv(mesh, "--codec", codec), WORLD)
        try:
            assert t.train()
            runs[codec] = (t.gather_params(), t.summary())
        finally:
            t.close()
    (dense, sd), (half, sh) = runs["none"], runs["fp16"]
    assert sh["axes"]["dp"]["bytes"] == pytest.approx(sd["axes"]["dp"]["bytes"] / 2, rel=0.01)
    assert sh["axes"]["pp"]["bytes"] == sd["axes"]["pp"]["bytes"]
    err = np.abs(half - dense).max() / np.abs(dense).max()
    assert 0 < err < 1e-2, err
    with shared_dir(WORLD) as d:
        argv = _argv(mesh, "--codec", "topk:ratio=0.5", "--epochs", "2")
        train([*argv, "--save-params", f"{d}/whole.npy"], WORLD)
        ckpt = ["--checkpoint-dir", f"{d}/ckpt", "--checkpoint-every", "2"]
        assert train([*argv, *ckpt, "--stop-after", "2"], WORLD) is None
        train([*argv, *ckpt, "--resume", "--save-params", f"{d}/again.npy"], WORLD)
        WORLD.Barrier()
        assert np.array_equal(np.load(f"{d}/whole.npy"), np.load(f"{d}/again.npy"))


@pytest.mark.world_sizes(4)
def test_shard_1_within_the_dp_groups():
    """dp2 x pp2 with ``--shard 1``: the optimizer state sharded within each dp group (half of
    it per rank), the same bits as the mesh without sharding; stopped and resumed (every rank's
    owned slices in its own file), the same bits again."""
    mesh = (2, 2, 1)
    with shared_dir(WORLD) as d:
        argv = _argv(mesh, "--epochs", "2")
        plain = train([*argv, "--save-params", f"{d}/plain.npy"], WORLD)
        zero = train([*argv, "--shard", "1", "--save-params", f"{d}/zero.npy"], WORLD)
        ckpt = ["--checkpoint-dir", f"{d}/ckpt", "--checkpoint-every", "2", "--shard", "1"]
        assert train([*argv, *ckpt, "--stop-after", "2"], WORLD) is None
        train([*argv, *ckpt, "--resume", "--save-params", f"{d}/again.npy"], WORLD)
        WORLD.Barrier()
        whole = np.load(f"{d}/plain.npy")
        assert np.array_equal(whole, np.load(f"{d}/zero.npy"))
        assert np.array_equal(whole, np.load(f"{d}/again.npy"))
        for dense, sharded in zip(plain["memory_ranks"], zero["memory_ranks"]):
            assert sharded["optimizer"] <= dense["optimizer"] // 2 + 4


@pytest.mark.world_sizes(4)
def test_resume_gives_the_same_bits():
    """pp2 x tp2 (every rank its own shard), stopped after step 2 with a checkpoint and resumed,
    ends with the bits of the run that never stopped; resuming on another mesh is refused on
    every rank."""
    mesh = (1, 2, 2)
    with shared_dir(WORLD) as d:
        argv = _argv(mesh)[:-2] + ["--epochs", "2", "--micro-batches", str(mesh[1])]
        whole, again = f"{d}/whole.npy", f"{d}/again.npy"
        assert train([*argv, "--save-params", whole], WORLD) is not None
        ckpt = ["--checkpoint-dir", f"{d}/ckpt", "--checkpoint-every", "2"]
        assert train([*argv, *ckpt, "--stop-after", "2"], WORLD) is None
        s = train([*argv, *ckpt, "--resume", "--save-params", again], WORLD)
        assert s["steps"] == 6
        WORLD.Barrier()
        assert np.array_equal(np.load(whole), np.load(again))
        other = [a if a != _spec(mesh) else "pp=4" for a in argv]
        other[other.index("--micro-batches") + 1] = "4"
        with pytest.raises(UsageError, match="another run|fingerprint|config"):
            train([*other, *ckpt, "--resume"], WORLD)
