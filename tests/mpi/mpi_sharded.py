"""Sharded data parallelism (``--shard 1|2|3``, ZeRO's stages) in the driver, in-process.

Every stage against plain data parallelism over the same global batch: the same parameters, bit
for bit (ring reduce-scatter over the plan's even split sums each element in ring allreduce's
order; docs/sharded.md), with parameter counts that do not divide by p and layers of fewer
elements than ranks; stop and resume bit for bit at every stage; a parameter codec at stages
1-2 against data parallelism with rounded masters, bit for bit; the measured memory split;
bad arguments and foreign checkpoints stopping every rank alike, overwriting nothing.
"""

import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

from collectives.sgd import main, train
from reference import trainer as _trainer

# blocks and pieces depend on p: one rank, even and odd p, more ranks than the CI's cores
pytestmark = pytest.mark.world_sizes(1, 2, 3, 4, 5)

WORLD = MPI.COMM_WORLD
TINY = ["--subset", "96", "--epochs", "1", "--batch-size", "4", "--quiet"]
#: the model's arguments, and the sharded runs' own: 235 parameters (not a multiple of p = 2, 3,
#: 4; one bucket), 219 with a middle layer of 4 elements (fewer than 5 ranks; tensors of one
#: element), and buckets of 131 elements (1,185 parameters: 9 buckets of rows, the bias in the
#: last one of its layer; the gradient's rows computed block by block; at 2 and 3 ranks, as
#: the pieces of every p are the other models')
MODELS = {"235": (["--hidden", "3"], []),
          "layer-of-4": (["--hidden", "3,1"], []),
          "buckets": (["--hidden", "16,5"], ["--bucket-mb", "0.0005"])}


def _final(argv, comm):
    """The full parameters after training ``argv`` (on every rank) and the trainer."""
    t = _trainer(argv, comm)
    assert t.train()
    t.exchange.close()
    return comm.bcast(t.exchange.full_params(), root=0), t


@pytest.mark.parametrize("model", ["235", "layer-of-4"])
def test_every_stage_gives_data_parallelism_bits(model):
    """ZeRO 1, 2, 3 against data parallelism (ring allreduce): identical parameters after an
    epoch; the replicas of stages 1-2 identical on every rank."""
    _assert_same_bits(*MODELS[model])


@pytest.mark.world_sizes(2, 3)
def test_every_stage_gives_data_parallelism_bits_in_small_buckets():
    _assert_same_bits(*MODELS["buckets"])


@pytest.mark.world_sizes(2, 3)
@pytest.mark.parametrize("balanced,pipelined", [(False, False), (True, True), (True, False),
                                                (False, True)])
def test_balanced_and_pipelined_buckets_give_the_same_bits(monkeypatch, balanced, pipelined):
    """The bucket layouts and schedules of ``collectives.sgd.sync.sharded`` (``BALANCED``: a
    block of rows of every owner's part of a layer, else consecutive rows; ``PIPELINED``:
    reduce-scatters on the progress engine, one in flight, at stages 2 and 3 or at neither;
    the default is balanced, pipelined at stage 3 only) end with data parallelism's parameters
    too."""
    from collectives.sgd.sync import sharded

    monkeypatch.setattr(sharded, "BALANCED", balanced)
    monkeypatch.setattr(sharded, "PIPELINED", {2, 3} if pipelined else set())
    for model in ("buckets", "layer-of-4"):
        _assert_same_bits(*MODELS[model], stages=(2, 3))


@pytest.mark.parametrize("stage", ["2", "3"])
@pytest.mark.parametrize("balanced,pipelined", [(False, False), (True, True)])
def test_per_bucket_update_gives_the_whole_shard_updates_bits(monkeypatch, stage, balanced,
                                                              pipelined):
    """The per-bucket update (``PER_BUCKET``: each bucket's slices of the shard updated as
    their average lands) against the update of the whole averaged shard after backward: the
    same parameters and momentum, bit for bit, at 1-5 ranks, with parameter counts that p does
    not divide (235, 219, 1,185), a layer of fewer elements than ranks, many buckets per layer,
    and top-k with error feedback in the reduce-scatter (the same buckets either way)."""
    from collectives.sgd.sync import sharded

    monkeypatch.setattr(sharded, "BALANCED", balanced)
    monkeypatch.setattr(sharded, "PIPELINED", {2, 3} if pipelined else set())
    comm = WORLD
    runs = [[*MODELS[m][0], *MODELS[m][1]] for m in MODELS]
    runs.append([*MODELS["buckets"][0], *MODELS["buckets"][1], "--codec", "topk:ratio=0.1",
                 "--error-feedback"])
    for extra in runs:
        argv = [*TINY, *extra, "--shard", stage]
        got = {}
        for per_bucket in (False, True):
            monkeypatch.setattr(sharded, "PER_BUCKET", per_bucket)
            params, t = _final(argv, comm)
            assert t.exchange.applies_update == per_bucket
            assert (t.exchange.zero.owned_grads is None) == per_bucket
            got[per_bucket] = (params.tobytes(), comm.allgather(t.opt.velocity.tobytes()))
            if stage == "2":
                assert comm.allgather(t.model.params.flat.tobytes()) == [params.tobytes()] * \
                    comm.size
        assert got[True] == got[False], extra


def _assert_same_bits(args, sharded, stages=(1, 2, 3)):
    comm = WORLD
    dp, _ = _final([*TINY, *args], comm)
    for stage in stages:
        params, t = _final([*TINY, *args, *sharded, "--shard", str(stage)], comm)
        assert params.tobytes() == dp.tobytes(), (stage, np.abs(params - dp).max())
        assert t.opt.velocity.size == t.exchange.plan.counts[comm.rank]
        # every wait counted once: communication moved out of compute leaves compute >= 0
        assert min(t.clock.seconds.values()) >= 0, dict(t.clock.seconds)
        if stage < 3:
            assert comm.allgather(t.model.params.flat.tobytes()) == [dp.tobytes()] * comm.size


def _shared_dir(comm):
    return comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0)


def _cleanup(comm, d):
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d)


@pytest.mark.world_sizes(2, 3)
@pytest.mark.parametrize("stage", ["1", "2", "3"])
def test_resume_is_bitwise(stage):
    """Stopped after step 7 (checkpoints every 3: sharded files of step 6) and resumed: the
    parameters of the run that never stopped, bit for bit; each rank wrote its own file."""
    comm = WORLD
    d = _shared_dir(comm)
    args = [*TINY, "--epochs", "2", "--hidden", "3", "--shard", stage, "--checkpoint-dir", d]
    whole, _ = _final(args, comm)
    assert train([*args, "--checkpoint-every", "3", "--stop-after", "7"], comm) is None
    assert sorted(os.listdir(os.path.join(d, "shards"))) == sorted(
        f"step000000006-rank{r}-of{comm.size}.npz" for r in range(comm.size))
    resumed, _ = _final([*args, "--resume"], comm)
    assert resumed.tobytes() == whole.tobytes()
    _cleanup(comm, d)


@pytest.mark.world_sizes(2, 3)
@pytest.mark.parametrize("stage", ["1", "2", "3"])
def test_compressed_gradients_inside_every_stage(stage):
    """``--codec`` inside sharded data parallelism (the compressed reduce-scatter): fp16 stays
    within fp16's rounding of the dense sharded run; top-k with error feedback keeps every
    rank's replica identical (stages 1-2) and resumes bit for bit, its residuals in the
    checkpoint."""
    comm = WORLD
    base = [*TINY, "--hidden", "3", "--shard", stage]
    dense, _ = _final(base, comm)
    half, _ = _final([*base, "--codec", "fp16"], comm)
    np.testing.assert_allclose(half, dense, rtol=0, atol=2e-3 * np.abs(dense).max())
    d = _shared_dir(comm)
    args = [*base, "--epochs", "2", "--codec", "topk:ratio=0.3", "--error-feedback",
            "--checkpoint-dir", d]
    whole, t = _final(args, comm)
    if stage != "3":
        assert comm.allgather(t.model.params.flat.tobytes()) == [whole.tobytes()] * comm.size
    assert not np.array_equal(whole, dense)  # the codec changed something
    assert train([*args, "--checkpoint-every", "3", "--stop-after", "7"], comm) is None
    resumed, _ = _final([*args, "--resume"], comm)
    assert resumed.tobytes() == whole.tobytes()
    _cleanup(comm, d)


@pytest.mark.world_sizes(2, 3)
@pytest.mark.parametrize("stage,codec,dtype", [("1", "fp16", "bfloat16"),
                                               ("2", "topk:ratio=0.3", "bfloat16"),
                                               ("3", "topk:ratio=0.3", "float16")])
def test_narrow_residuals_inside_sharded_training(stage, codec, dtype):
    """``--residual-dtype``: every residual (one per bucket and destination block; fp16 through
    the summable strategy's compensate and remember, top-k through the fused encode) is stored
    in two bytes per element; the replicas of stages 1-2 stay identical; the run stays near the
    float32 residuals' one without being it; a resumed run gives the same bits."""
    comm = WORLD
    d = _shared_dir(comm)
    base = [*TINY, "--epochs", "2", "--hidden", "3", "--shard", stage, "--codec", codec,
            "--error-feedback"]
    wide, _ = _final(base, comm)
    args = [*base, "--residual-dtype", dtype, "--checkpoint-dir", d]
    whole, t = _final(args, comm)
    residuals = t.state.memory.state.values()
    assert residuals and all(r.error.dtype == (np.float16 if dtype == "float16" else np.uint16)
                             and r.spare is None for r in residuals)
    if stage != "3":
        assert comm.allgather(t.model.params.flat.tobytes()) == [whole.tobytes()] * comm.size
    assert not np.array_equal(whole, wide)
    np.testing.assert_allclose(whole, wide, rtol=0, atol=0.05 * np.abs(wide).max())
    assert train([*args, "--checkpoint-every", "3", "--stop-after", "7"], comm) is None
    resumed, _ = _final([*args, "--resume"], comm)
    assert resumed.tobytes() == whole.tobytes()
    _cleanup(comm, d)


@pytest.mark.world_sizes(2, 3)
def test_stage_3_with_bf16_parameters_in_the_gathers():
    """``--shard 3 --param-codec bf16``: the layers' gathers decode bf16 (the shards stay
    float32 masters): training follows the dense stage 3 within bf16's rounding, and resumes
    bit for bit."""
    comm = WORLD
    base = [*TINY, "--hidden", "3", "--shard", "3"]
    dense, _ = _final(base, comm)
    d = _shared_dir(comm)
    args = [*base, "--epochs", "2", "--param-codec", "bf16", "--checkpoint-dir", d]
    whole, t = _final(args, comm)
    owned = t.exchange.zero.owned_params
    assert not np.array_equal(owned, owned.astype(np.float32).view(np.uint32)
                              .__and__(np.uint32(0xFFFF0000)).view(np.float32))
    short, _ = _final([*base, "--param-codec", "bf16"], comm)
    assert not np.array_equal(short, dense)
    np.testing.assert_allclose(short, dense, rtol=0, atol=2e-2 * np.abs(dense).max())
    assert train([*args, "--checkpoint-every", "3", "--stop-after", "7"], comm) is None
    resumed, _ = _final([*args, "--resume"], comm)
    assert resumed.tobytes() == whole.tobytes()
    _cleanup(comm, d)


def _bf16(x):
    """float32 ``x`` rounded to bfloat16 (nearest even) and back: plain NumPy on the bits."""
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def _fp16(x):
    return x.astype(np.float16).astype(np.float32)


ROUNDINGS = {"bf16": _bf16, "fp16": _fp16}


def _rounded_reference(argv, comm, rounding):
    """Data parallelism (ring allreduce: the sharded runs' averaged gradients, bit for bit) with
    a float32 master that the update writes, the model computing with ``rounding(master)`` from
    the first step on: ``(master, the rounded parameters)``."""
    from collectives.sgd.optim import SGD

    t = _trainer(argv, comm)
    params = t.model.params.flat
    master = params.copy()
    t.opt = SGD(master, t.opt.momentum, t.opt.weight_decay)
    params[...] = rounding(master)
    t.exchange.average_params = lambda step: params.__setitem__(Ellipsis, rounding(master))
    assert t.train()
    t.exchange.close()
    return master, params


@pytest.mark.parametrize("stage", ["1", "2"])
@pytest.mark.parametrize("codec", ["bf16", "fp16"])
def test_parameter_codec_at_stages_1_2_rounds_the_masters(stage, codec):
    """``--shard 1|2 --param-codec``: each owner's float32 master slice is what data
    parallelism's update writes when the model computes with the rounded masters (a one-run
    simulation of the same rounding), bit for bit; every rank's replica is the rounded masters,
    bitwise the same everywhere; the consolidated parameters are the masters; the ledger counts
    the master slice. A parameter count that p does not divide (235, or 219 at p = 5)."""
    comm = WORLD
    args = [*TINY, *MODELS["235" if comm.size % 5 else "layer-of-4"][0]]
    master, rounded = _rounded_reference(args, comm, ROUNDINGS[codec])
    assert not np.array_equal(master, rounded)  # the rounding did something
    full, t = _final([*args, "--shard", stage, "--param-codec", codec], comm)
    zero = t.exchange.zero
    assert zero.owned_params.tobytes() == master[zero.mine].tobytes()
    assert full.tobytes() == master.tobytes()
    assert comm.allgather(t.model.params.flat.tobytes()) == [rounded.tobytes()] * comm.size
    assert t.ledger.report()["master"] == 4 * t.exchange.plan.counts[comm.rank]
    assert t.opt.params is zero.owned_params


@pytest.mark.world_sizes(2, 3)
def test_stage_2_with_a_parameter_codec_resumes_bitwise():
    """Stopped after step 7 and resumed from the sharded checkpoint of step 6 (the master
    slices): the masters and every rank's rounded replica of the run that never stopped, bit
    for bit; --save-params writes the masters."""
    comm = WORLD
    d = _shared_dir(comm)
    path = os.path.join(d, "final.npy")
    args = [*TINY, "--epochs", "2", "--hidden", "3", "--shard", "2", "--param-codec", "bf16",
            "--checkpoint-dir", d]
    whole, t = _final(args, comm)
    replica = t.model.params.flat.tobytes()
    assert train([*args, "--checkpoint-every", "3", "--stop-after", "7"], comm) is None
    resumed, t = _final([*args, "--resume"], comm)
    assert resumed.tobytes() == whole.tobytes()
    assert comm.allgather(t.model.params.flat.tobytes()) == [replica] * comm.size
    train([*args, "--resume", "--save-params", path], comm)  # from step 6 again
    comm.Barrier()
    assert comm.rank != 0 or np.load(path).tobytes() == whole.tobytes()
    _cleanup(comm, d)


@pytest.mark.world_sizes(1, 2, 3)
def test_consolidated_export_loads_in_one_process():
    """--save-params at stage 3 writes the full parameters from rank 0 (gathered from the
    shards): a single process loads them and gets the run's test loss and accuracy."""
    comm = WORLD
    d = _shared_dir(comm)
    path, log = os.path.join(d, "final.npy"), os.path.join(d, "log.json")
    train([*TINY, "--hidden", "3", "--shard", "3", "--save-params", path, "--log", log], comm)
    comm.Barrier()
    if comm.rank == 0:
        t = _trainer([*TINY, "--hidden", "3"], MPI.COMM_SELF)
        t.model.params.flat[...] = np.load(path)
        loss, correct = t.model.evaluate(t.ds.x_test, t.ds.y_test)
        with open(log) as f:
            last = json.load(f)["epochs"][-1]
        assert correct / len(t.ds.y_test) == last["test_acc"]
        assert loss / len(t.ds.y_test) == pytest.approx(last["test_loss"], rel=1e-5)
    _cleanup(comm, d)


@pytest.mark.world_sizes(2, 3)
def test_memory_split_shrinks_by_the_ranks():
    """The report's peak memory per rank, measured from the arrays held: gradient + optimizer
    state at stage 2 within 1/p of data parallelism's + 5 %; the optimizer state 1/p from
    stage 1 on; every category in the
    summary, and the peak resident set size; the parameters at stage 3 within the shard and
    the two largest layers (the one computing and the one arriving)."""
    comm, p = WORLD, WORLD.size
    args = [*TINY, "--subset", "64", "--hidden", "1024,768"]  # 861,450 parameters
    dp = train(args, comm)["memory"]
    n_bytes = 4 * 861450
    assert dp["parameters"] == dp["gradients"] == dp["optimizer"] == n_bytes
    for stage in (1, 2, 3):
        m = train([*args, "--shard", str(stage)], comm)["memory"]
        assert set(m) >= {"parameters", "gradients", "optimizer", "codec", "buffers", "total",
                          "rss"} and m["rss"] > m["total"] > 0
        assert m["optimizer"] <= -(-n_bytes // (4 * p)) * 4
        if stage >= 2:
            assert m["gradients"] + m["optimizer"] <= (dp["gradients"] + dp["optimizer"]) / p \
                * 1.05, (stage, m, dp)
        if stage == 3:
            shard, layers = -(-861450 // p), [66560, 787200, 7690]
            assert m["parameters"] <= 4 * (shard + layers[0] + layers[1]), m


@pytest.mark.world_sizes(1, 2, 3)
@pytest.mark.parametrize("argv", [
    ["--shard", "4"],
    ["--shard", "0"],
    ["--shard", "2", "--sync", "gossip:ring"],
    ["--shard", "1", "--sync", "local:2"],
    ["--shard", "2", "--sync", "ssp:1"],
    ["--shard", "3", "--sync", "async"],
    ["--shard", "3", "--check-replicas"],
    ["--shard", "2", "--overlap"],
    ["--shard", "1", "--codec", "auto:topk:ratio=0.1"],
    ["--shard", "2", "--codec", "topk:ratio=0.1", "--strategy", "allgather"],
    ["--param-codec", "bf16"],
    ["--shard", "2", "--param-codec", "powersgd"],
    ["--shard", "1", "--param-codec", "auto:bf16"],
    ["--shard", "1", "--param-codec", "nope"],
    ["--shard", "3", "--param-codec", "powersgd"],
    ["--shard", "2", "--param-codec", "topk:ratio=0.1"],
    ["--shard", "3", "--param-codec", "qsgd"],
    ["--shard", "2", "--algorithm", "rabenseifner"],
    ["--shard", "2", "--residual-dtype", "float16"],
    ["--shard", "2", "--codec", "fp16", "--residual-dtype", "bfloat16"],
])
def test_bad_arguments_return_2_everywhere(argv):
    comm = WORLD
    assert comm.allgather(main([*TINY, "--hidden", "3", *argv], comm)) == [2] * comm.size


def _files(d):
    return {os.path.join(root, f): open(os.path.join(root, f), "rb").read()
            for root, _, names in os.walk(d) for f in names}


def _stopped(d, stage):
    """A run of stage ``stage`` (0: data parallelism) that checkpoints into ``d`` and stops at
    step 2."""
    return [*TINY, "--hidden", "3", "--checkpoint-dir", d, "--checkpoint-every", "2",
            "--stop-after", "2"] + (["--shard", str(stage)] if stage else [])


def _refused_everywhere(comm, argv, d):
    """``argv --resume`` exits with 2 on every rank and leaves ``d`` as it was."""
    comm.Barrier()
    before = comm.bcast(_files(d) if comm.rank == 0 else None, root=0)
    assert comm.allgather(main([*argv, "--resume"], comm)) == [2] * comm.size
    comm.Barrier()
    assert comm.rank != 0 or _files(d) == before


@pytest.mark.world_sizes(2, 3)
def test_foreign_checkpoints_stop_every_rank_and_overwrite_nothing():
    """A checkpoint of another stage or of data parallelism, of another world size (written by
    a communicator of p - 1 ranks), or with one rank's file missing: exit code 2 on every rank,
    and every file of the checkpoint as it was."""
    comm = WORLD
    d = _shared_dir(comm)
    assert train(_stopped(d, 2), comm) is None
    for other in (3, 1, 0):
        _refused_everywhere(comm, _stopped(d, other), d)
    _cleanup(comm, d)

    d = _shared_dir(comm)
    assert train(_stopped(d, 0), comm) is None
    _refused_everywhere(comm, _stopped(d, 2), d)
    _cleanup(comm, d)

    d = _shared_dir(comm)
    sub = comm.Split(color=int(comm.rank < comm.size - 1), key=comm.rank)
    if comm.rank < comm.size - 1:
        assert train(_stopped(d, 2), sub) is None
    sub.Free()
    _refused_everywhere(comm, _stopped(d, 2), d)
    _cleanup(comm, d)

    d = _shared_dir(comm)
    assert train(_stopped(d, 3), comm) is None
    comm.Barrier()
    if comm.rank == 0:
        os.unlink(os.path.join(d, "shards", f"step000000002-rank{comm.size - 1}-of"
                                            f"{comm.size}.npz"))
    _refused_everywhere(comm, _stopped(d, 3), d)
    _cleanup(comm, d)
