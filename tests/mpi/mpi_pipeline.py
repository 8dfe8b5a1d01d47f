"""Pipeline parallelism in the SGD driver (``--pipeline S``, collectives.parallel.pipeline): the
same parameters as the model trained in one process on the same global batches, every schedule,
every ``dp x pp`` mesh of the world size (singleton axes included), layer counts that do not
divide by S; bad flags and a stage that raises stopping every rank with a clear error."""

import json

import numpy as np
import pytest
from mpi4py import MPI

from collectives import Mesh
from collectives._runtime.cli import UsageError
from collectives.parallel.pipeline import Pipeline, PipelineError
from collectives.sgd import data, datasets, main, train
from collectives.sgd.cli import parse
from collectives.sgd.model import MLP
from collectives.sgd.optim import SGD, Schedule
from collectives.sgd.driver import PipelinedTrainer
from collectives.sgd.pipelined import MLPStage
from reference import shared_dir

# 1-4 ranks: every factorisation dp x pp of them (S = 1, 2, 3, 4; singleton axes at each end)
pytestmark = pytest.mark.world_sizes(1, 2, 3, 4)

WORLD = MPI.COMM_WORLD
HIDDEN = (12, 10, 8, 6)  # 5 layers: no S of 2, 3 or 4 divides them
BATCH = 8
#: after 3 steps, the largest difference from the one-process full-batch reference, relative to
#: the parameters' largest magnitude (measured at 1-4 ranks: 2e-8 to 6e-8; float32's epsilon is
#: 1.2e-7): the micro-batches' gradients are added in another order than one batch's
RTOL = 1e-6


def _argv(stages, schedule, microbatches, replicas):
    return ["--subset", str(24 * replicas), "--epochs", "1", "--hidden", ",".join(map(str, HIDDEN)),
            "--batch-size", str(BATCH), "--lr", "4", "--weight-decay", "1e-3", "--quiet",
            "--pipeline", str(stages), "--micro-batches", str(microbatches),
            "--schedule", schedule]


def _run(argv, comm):
    pre = parse(argv, comm.size, 10**12)
    ds = datasets.load(pre.args.dataset, pre.args.subset)
    t = PipelinedTrainer(parse(argv, comm.size, len(ds.y_train)), ds, comm)
    t.t_start = 0.0
    try:
        assert t.train()
        return t, t.gather_params()
    finally:
        t.close()


def _reference(t, micro=False):
    """The same model trained in one process: every step's global batch (the replicas'
    batches together) at once, or (``micro``, one replica) in the run's micro-batches, one
    stage holding every layer."""
    a, ds = t.args, t.ds
    sizes = t.sizes
    L = len(sizes) - 1
    stage = MLPStage(sizes, 0, L, a.seed)
    model = MLP(sizes, seed=a.seed)
    assert np.array_equal(model.params.flat, stage.params.flat)
    params = stage.params if micro else model.params
    opt = SGD(params.flat, a.momentum, a.weight_decay)
    sched = Schedule(a.lr, a.batch_size * t.replicas, int(round(a.warmup_epochs * t.spe)), t.total)
    for step in range(t.total):
        epoch, i = divmod(step, t.spe)
        batches = [data.shard(len(ds.y_train), t.replicas, r, a.seed, epoch)
                   [i * BATCH:(i + 1) * BATCH] for r in range(t.replicas)]
        if micro:
            assert t.replicas == 1
            b = batches[0]
            stage.begin(ds.x_train[b], ds.y_train[b], len(b), t.microbatches)
            for m in range(t.microbatches):
                stage.forward(m, None)
                stage.backward(m, None)
            grad = stage.grads.flat
        else:
            b = np.concatenate(batches)
            model.loss_and_grad(ds.x_train[b], ds.y_train[b])
            grad = model.grads.flat
        opt.step(grad, sched(step))
    return params.flat


def test_pipelined_training_matches_one_process():
    """Every mesh dp x pp of the world (S dividing W): GPipe and 1F1B end with the same bits
    (same micro-batches, same order of the gradient's sum); both within RTOL of the one-process
    run on the whole global batch; with one replica, the same bits as one process running the
    same micro-batches through all layers; every rank holds the same whole model."""
    for stages in [s for s in range(1, WORLD.size + 1) if WORLD.size % s == 0]:
        _matches_one_process(stages)


def _matches_one_process(stages):
    replicas = WORLD.size // stages
    microbatches = stages + 1  # 8 samples in 2-5 uneven micro-batches
    runs = {}
    for schedule in ("gpipe", "1f1b"):
        t, runs[schedule] = _run(_argv(stages, schedule, microbatches, replicas), WORLD)
    assert np.array_equal(runs["gpipe"], runs["1f1b"])
    ref = _reference(t)
    assert runs["gpipe"].shape == ref.shape
    assert not np.array_equal(ref, MLP(t.sizes, seed=0).params.flat)  # it trained
    err = np.abs(runs["gpipe"] - ref).max() / np.abs(ref).max()
    assert err < RTOL, err
    if replicas == 1:
        assert np.array_equal(runs["gpipe"], _reference(t, micro=True))
    for other in WORLD.allgather(runs["gpipe"]):
        assert np.array_equal(other, runs["gpipe"])


def test_summary_reports_bubble_and_memory():
    """The report's pipeline block: per stage its layers, a bubble in [0, 1], and 1F1B's peak of
    at most S micro-batches (GPipe's M)."""
    S = WORLD.size
    for schedule, peak in (("1f1b", lambda s: min(S - s, S + 2)), ("gpipe", lambda s: S + 2)):
        argv = _argv(S, schedule, S + 2, 1)
        pre = parse(argv, S, 10**12)
        ds = datasets.load(pre.args.dataset, pre.args.subset)
        t = PipelinedTrainer(parse(argv, S, len(ds.y_train)), ds, WORLD)
        t.t_start = 0.0
        try:
            assert t.train()
            s = t.summary()
        finally:
            t.close()
        p = s["pipeline"]
        assert p["stages"] == S and p["microbatches"] == S + 2 and p["replicas"] == 1
        assert [st["layers"] for st in p["per_stage"]] == \
            [[t.bounds[k], t.bounds[k + 1]] for k in range(S)]
        assert s["params"] == MLP(t.sizes).params.size
        for k, st in enumerate(p["per_stage"]):
            assert st["peak_microbatches"] == peak(k)
            assert 0 <= st["bubble"] <= 1 and st["peak_activation_bytes"] > 0


def test_bad_pipeline_flags_stop_every_rank():
    """Micro-batches below the stages, more stages than layers, S not dividing the world size,
    a split that does not add up, flags a pipeline does not take: the same UsageError on every
    rank (parse runs before any message), exit status 2 from main."""
    W = WORLD.size
    base = ["--hidden", "8,8,8,8", "--subset", "64", "--batch-size", "4", "--quiet"]
    cases = [(["--pipeline", str(W + 1)], "must divide the world size"),
             (["--pipeline", str(W), "--micro-batches", str(max(1, W - 1))] if W > 1 else
              ["--micro-batches", "2"], "below the" if W > 1 else "need --pipeline"),
             (["--pipeline", "1", "--split", "2,2"], "adding up to"),
             (["--pipeline", "1", "--sync", "local:2"], "does not take --sync local:2"),
             (["--pipeline", "1", "--overlap"], "does not take --overlap")]
    if W > 2:
        cases.append((["--pipeline", str(W), "--hidden", "8"], "every stage needs at least one"))
    for extra, message in cases:
        with pytest.raises(UsageError, match=message):
            parse(base + extra, W, 64)
        assert main(base + extra, WORLD) == 2


class _Toy:
    """A stage that doubles its input (stage 0: ones) and raises on ``fail`` = (stage, action,
    micro-batch)."""

    def __init__(self, stage, fail=None):
        self.stage, self.fail = stage, fail

    def _maybe(self, kind, m):
        if self.fail == (self.stage, kind, m):
            raise ValueError(f"boom in {kind} {m}")

    def buffer(self, kind, m):
        return np.empty(3, np.float32)

    def forward(self, m, x):
        self._maybe("FORWARD", m)
        return np.ones(3, np.float32) if x is None else 2 * x

    def backward(self, m, dy):
        self._maybe("BACKWARD", m)
        return np.ones(3, np.float32) if dy is None else dy + 1


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("where", [("FORWARD", 1), ("BACKWARD", 0)])
def test_a_stage_that_raises_stops_every_rank(schedule, where):
    """The last stage raises: it raises its own error, every other rank (the other stages, the
    other replicas' whole pipelines) a PipelineError naming the stage, action and error; then a
    new pipeline on the same ranks runs."""
    W = WORLD.size
    S = 2
    shape = (W // S, S) if W % S == 0 else (1, W)
    with Mesh(shape, names=("dp", "pp")) as mesh:
        dp, pp = mesh.coords()
        S = mesh.size("pp")
        fail = (S - 1, *where) if dp == 0 else None
        pipe = Pipeline(schedule, S + 1, mesh.comm("pp"), world=mesh.comm())
        with pytest.raises((ValueError, PipelineError)) as info:
            pipe.step(_Toy(pp, fail))
        if fail is not None and pp == S - 1:
            assert info.type is ValueError and "boom" in str(info.value)
        else:
            assert info.type is PipelineError
            # the failing rank's position in the mesh: (dp 0, pp S-1) is S - 1
            assert f"stage {S - 1} (rank {S - 1}) raised in {where[0]} " \
                   f"{where[1]}: ValueError: boom in {where[0]} {where[1]}" in str(info.value)
        with Pipeline(schedule, S, mesh.comm("pp"), world=mesh.comm()) as again:
            stats = again.step(_Toy(pp))
            assert stats.peak_held == (S if schedule == "gpipe" else S - pp)


def test_resume_gives_the_same_bits_and_a_changed_run_is_refused():
    """S = W stages (one pipeline): stopped after step 2 with a checkpoint, resumed under the
    other schedule (the schedule does not change the bits), the final parameters are those of
    the run that never stopped; the --log holds the bubble; resuming with other micro-batches
    is refused on every rank."""
    W = WORLD.size
    with shared_dir(WORLD) as d:
        argv = _argv(W, "1f1b", W + 1, 1)[:-2] + ["--epochs", "2"]
        whole, again = f"{d}/whole.npy", f"{d}/again.npy"
        assert train([*argv, "--schedule", "gpipe", "--save-params", whole,
                      "--log", f"{d}/log.json"], WORLD) is not None
        ckpt = ["--checkpoint-dir", f"{d}/ckpt", "--checkpoint-every", "2"]
        assert train([*argv, "--schedule", "gpipe", *ckpt, "--stop-after", "2"], WORLD) is None
        s = train([*argv, "--schedule", "1f1b", *ckpt, "--resume", "--save-params", again], WORLD)
        assert s["steps"] == 6
        WORLD.Barrier()
        assert np.array_equal(np.load(whole), np.load(again))
        with open(f"{d}/log.json") as f:
            log = json.load(f)
        assert [0 <= e["bubble"] <= 1 for e in log["epochs"]] == [True, True]
        assert len(log["summary"]["pipeline"]["per_stage"]) == W
        other = [a if a != str(W + 1) else str(W + 2) for a in argv]
        with pytest.raises(UsageError, match="another run|fingerprint|config"):
            train([*other, *ckpt, "--resume"], WORLD)
