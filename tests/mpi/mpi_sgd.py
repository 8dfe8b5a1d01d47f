"""The SGD driver in-process on every world size and communicator: tiny runs, replicas in lockstep,
bad arguments stopping every rank alike, and a bitwise resume."""

import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import compress
from collectives.decentralized import topology
from collectives.sgd import datasets
from collectives.sgd import checkpoint, data, main, train
from collectives.sgd.cli import parse
from collectives.sgd.driver import STATE_PREFIX, Trainer
from reference import trainer as _trainer

# The driver in-process: its sync modes and checkpoints over collectives that run at every size
# elsewhere; one rank, two and an odd number (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3)

TINY = ["--subset", "128", "--epochs", "1", "--hidden", "16", "--batch-size", "4", "--quiet"]


WORLD = MPI.COMM_WORLD


def test_tiny_run_keeps_replicas_identical(comm):
    s = train([*TINY, "--check-replicas"], comm)  # raises if any step's hashes differ
    assert s["world"] == comm.size and s["steps"] == (128 // comm.size) // 4
    # the median step: the slowest rank's, so the same on every rank, and within the steps' range
    assert comm.allgather(s["step_median_s"]) == [s["step_median_s"]] * comm.size
    assert 0 < s["step_median_s"] <= comm.allreduce(s["seconds"]["step"], op=MPI.MAX)


def test_tiny_gossip_run_reports_its_consensus_distance():
    """D-PSGD on the one-peer exponential graph (time-varying from 3 ranks): one message per
    rank per step, counted; the consensus distance of every epoch, the same on every rank, 0 on
    one rank and where one period averages exactly (2 ranks)."""
    comm = WORLD
    s = train([*TINY, "--sync", "gossip:one_peer_exponential"], comm)
    per_step = s["params"] * 4 * (comm.size > 1)
    assert s["exchanges"] == s["steps"] and s["bytes_mean"] == s["steps"] * per_step
    spread = comm.allgather(s["consensus"])
    assert spread == [spread[0]] * comm.size and np.isfinite(spread[0])
    if comm.size <= 2:
        assert spread[0] < 1e-6
    else:
        assert spread[0] > 0


def test_tiny_gossip_with_overlap_mixes_x_t_during_the_step():
    """--sync gossip:one_peer_exponential --overlap: one message of the parameters per rank and
    step, counted; the consensus distance the same on every rank; on one rank (no neighbor:
    the round is the identity) the same bits as the mixing after the update."""
    comm = WORLD
    s = train([*TINY, "--sync", "gossip:one_peer_exponential", "--overlap"], comm)
    assert s["exchanges"] == s["steps"] and s["bytes_mean"] == s["steps"] * s["params"] * 4 * (
        comm.size > 1)
    assert s["mix_ahead"] and not s["overlap"]
    spread = comm.allgather(s["consensus"])
    assert spread == [spread[0]] * comm.size and np.isfinite(spread[0])
    if comm.size == 1:
        ahead = _trainer([*TINY, "--sync", "gossip:ring", "--overlap"], comm)
        after = _trainer([*TINY, "--sync", "gossip:ring"], comm)
        assert ahead.train() and after.train()
        assert np.array_equal(ahead.model.params.flat, after.model.params.flat)
    # on the full graph a round is the exact average: x_{t+1} = mean(x_t) - lr_t v_t, so each
    # replica's distance from the replicas' mean is the last update's, -lr_T (v - mean(v))
    t = _trainer([*TINY, "--sync", "gossip:full", "--overlap"], comm)
    assert t.train()
    x, v = t.model.params.flat, t.opt.velocity
    lr = t.schedule(t.step - 1)
    dx = x - comm.allreduce(x.astype(np.float64)) / comm.size
    dv = v - comm.allreduce(v.astype(np.float64)) / comm.size
    assert np.allclose(dx, -lr * dv, rtol=1e-3, atol=1e-6), np.abs(dx + lr * dv).max()


def test_gossip_in_float16_sends_half_the_bytes_and_keeps_its_own_part():
    """--gossip-dtype float16 (with and without --overlap): one message of the parameters in
    float16 per rank and step, counted (the fp16 codec's payload, exactly); one round on
    set parameters gives, bit for bit, the self weight times this rank's own float32
    parameters plus the rest of the weight times the neighbor's parameters rounded to float16
    (the one-peer exponential graph, whose peer changes with the step from 3 ranks); with no
    neighbor (one rank) the parameters stay as they are."""
    comm = WORLD
    for overlap in ([], ["--overlap"]):
        args = [*TINY, "--sync", "gossip:one_peer_exponential", *overlap]
        s = train([*args, "--gossip-dtype", "float16"], comm)
        assert s["exchanges"] == s["steps"] and s["gossip_dtype"] == "float16"
        payload = compress.from_spec("fp16").payload_nbytes((s["params"],))
        assert payload < s["params"] * 2 + 64  # the codec's header, then 2 bytes a parameter
        assert s["bytes_mean"] == s["steps"] * payload * (comm.size > 1)
        assert np.isfinite(s["loss"]) and np.isfinite(s["consensus"])
    t = _trainer([*TINY, "--sync", "gossip:one_peer_exponential", "--overlap",
                  "--gossip-dtype", "float16"], comm)
    x = t.model.params.flat
    for step in (1, 2):
        x[...] = np.random.default_rng(comm.rank + 10 * step).standard_normal(x.size) * 0.3
        xs = comm.allgather(x.copy())
        mine, weights = t.exchange.topology.recv_weights(comm.rank, step)
        want = xs[comm.rank].copy()
        if weights:
            (q, w), = weights.items()
            want *= mine
            want += w * xs[q].astype(np.float16).astype(np.float32)
            exact = mine * xs[comm.rank] + w * xs[q]
            assert 0 < np.abs(want - exact).max() <= w * np.abs(xs[q]).max() * 2.0 ** -11
        t.exchange.start_mix(step)
        t.exchange.finish_mix(step)
        assert x.tobytes() == want.tobytes(), (comm.rank, step)


def test_tiny_parameter_server_runs():
    """--sync ssp:0 is synchronous SGD (the same trajectory to rounding: the p pushes add up in
    any order); ssp:2 and async train; a push sends the other ranks' shards, n (p-1)/p bytes."""
    comm = WORLD
    sync = train(TINY, comm)
    ssp0 = train([*TINY, "--sync", "ssp:0"], comm)
    assert abs(ssp0["loss"] - sync["loss"]) < 1e-4 * max(1.0, sync["loss"]), \
        (ssp0["loss"], sync["loss"])
    for spec in ("ssp:2", "async"):
        s = train([*TINY, "--sync", spec], comm)
        assert np.isfinite(s["loss"]) and s["exchanges"] == s["steps"]
        assert s["bytes_mean"] == s["steps"] * (s["params"] * 4 * (comm.size - 1) // comm.size)


def test_tiny_push_sum_runs():
    """--sync sgp (push-sum over the one-peer exponential graph through a Window, rounds
    synchronised) and sgp:overlap train; one message of the parameters and the weight per step;
    with synchronised rounds at 2 ranks (W = J every round) the replicas agree."""
    comm = WORLD
    for spec in ("sgp", "sgp:overlap"):
        s = train([*TINY, "--sync", spec], comm)
        assert np.isfinite(s["loss"]) and s["exchanges"] == s["steps"]
        assert s["bytes_mean"] == s["steps"] * (s["params"] + 1) * 4 * (comm.size > 1)
        if spec == "sgp" and comm.size <= 2:
            assert s["consensus"] < 1e-5, s["consensus"]


def test_tiny_compressed_run_keeps_replicas_identical():
    s = train([*TINY, "--check-replicas", "--codec", "topk:ratio=0.1"], WORLD)
    assert s["exchanges"] == s["steps"]


def test_timeline_of_an_overlapped_compressed_run():
    """--timeline: the merged file (rank 0) has each rank's steps, with the buckets' requests
    running on the engine's lane inside the step, and passes the trace-event checks."""
    import tempfile

    from collectives.diagnostics import timeline

    path = WORLD.bcast(tempfile.mkdtemp() if WORLD.rank == 0 else None, root=0) + "/t.json"
    s = train([*TINY, "--overlap", "--codec", "topk:ratio=0.1", "--timeline", path], WORLD)
    if WORLD.rank == 0:
        doc = timeline.chrome.read(path)
        timeline.check(doc)
        spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        for r in range(WORLD.size):
            steps = [e for e in spans if e["pid"] == r and e["name"] == "step"]
            assert len(steps) == s["steps"]
            if WORLD.size > 1:
                requests = [e for e in spans if e["pid"] == r and e["cat"] == "request"]
                assert requests and all(e["args"]["codec"] == "topk" for e in requests)
                first, last = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
                assert all(first <= e["ts"] <= last for e in requests)
    WORLD.Barrier()


@pytest.mark.parametrize("argv", [
    ["--codec", "bogus"],
    ["--batch-size", "0"],
    ["--codec", "topk:ratio=2"],
    ["--codec", "topk", "--strategy", "summable"],
    ["--batch-size", "200"],
    ["--sync", "gossip:star"],
    ["--sync", "gossip:nodes:star"],
    ["--sync", "adpsgd:star"],
    ["--sync", "adpsgd", "--codec", "topk"],
    ["--sync", "gossip:ring", "--codec", "topk", "--gamma", "1.5"],
    ["--sync", "gossip:ring", "--codec", "threshold"],
])
def test_bad_arguments_return_2_everywhere(argv):
    comm = WORLD
    codes = comm.allgather(main([*TINY, *argv], comm))
    assert codes == [2] * comm.size


def _shared_dir(comm):
    path = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0)
    return path


def test_corrupt_checkpoint_returns_2_everywhere():
    comm = WORLD
    d = _shared_dir(comm)
    if comm.rank == 0:
        with open(os.path.join(d, "checkpoint.npz"), "wb") as f:
            f.write(b"PK\x03\x04 broken")
    comm.Barrier()
    assert comm.allgather(main([*TINY, "--checkpoint-dir", d, "--resume"], comm)) == [2] * comm.size
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d)


def test_resume_is_bitwise():
    comm = WORLD
    d = _shared_dir(comm)
    args = [*TINY, "--epochs", "2", "--codec", "topk:ratio=0.1", "--checkpoint-dir", d]
    whole = np.load(_params(comm, train, [*args], d, "whole.npy"))
    assert train([*args, "--checkpoint-every", "3", "--stop-after", "4"], comm) is None
    resumed = np.load(_params(comm, train, [*args, "--resume"], d, "resumed.npy"))
    assert np.array_equal(whole, resumed)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d)


def _params(comm, fn, args, d, name):
    path = os.path.join(d, name)
    fn([*args, "--save-params", path], comm)
    comm.Barrier()
    return path


@pytest.mark.parametrize("codec", [["--codec", "efsignsgd", "--strategy", "two_phase"],
                                   ["--codec", "qsgd", "--error-feedback"],
                                   ["--codec", "powersgd:rank=2"]])
def test_checkpoint_holds_exactly_the_state_dict(codec):
    """Of the compression, a checkpoint holds each rank's state.state_dict() and nothing else."""
    comm = WORLD
    d = _shared_dir(comm)
    argv = [*TINY, *codec, "--checkpoint-dir", d, "--checkpoint-every", "3", "--stop-after", "3"]
    pre = parse(argv, comm.size, 10**12)  # as train() does
    ds = datasets.load(pre.args.dataset, pre.args.subset)
    t = Trainer(parse(argv, comm.size, len(ds.y_train)), ds, comm)
    t.t_start = 0.0
    assert t.train() is False
    comm.Barrier()
    arrays = checkpoint.read(os.path.join(d, checkpoint.FILENAME))
    head = f"rank{comm.rank}/{STATE_PREFIX}"
    mine = {k[len(head):]: v for k, v in arrays.items() if k.startswith(head)}
    want = t.state.state_dict()
    assert sorted(mine) == sorted(want)
    for k, v in want.items():
        assert np.array_equal(mine[k], v), k
    others = {k for k in arrays if not k.partition("/")[2].startswith(STATE_PREFIX)}
    expected = {"meta", "shared/params", "shared/momentum"} | \
        {f"rank{r}/{name}" for r in range(comm.size) for name in ("epoch_loss", "stats")}
    assert others == expected, sorted(others ^ expected)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d)


@pytest.mark.parametrize("spec, strategy", [
    ("topk:ratio=0.1", "allgather"), ("topk:ratio=0.1", "sparse"), ("fp16", "summable"),
    ("efsignsgd", "two_phase"), ("powersgd:rank=1", "summable"), ("qsgd", "allgather")])
def test_compressed_overlap_equals_the_blocking_exchange_of_each_bucket(spec, strategy):
    """--overlap with a codec: each bucket started during backward through
    icompressed_allreduce gives the bits compressed_allreduce gives that bucket (same key, step
    and order), over two steps, and leaves the same codec state."""
    import collectives
    from collectives.sgd.sync import Synchronous
    from collectives.sgd.model import MLP
    from collectives.sgd.timing import Clock

    comm = WORLD
    m = MLP((9, 6, 4), seed=0)
    ours, reference = (collectives.CompressionState.from_spec(spec, error_feedback=None, seed=3,
                                                             rank=comm.rank) for _ in "ab")
    overlap = Synchronous(m.grads, m.params, comm, Clock(), state=ours, algorithm="ring",
                          strategy=strategy, bucket_bytes=3 * 6 * 4)
    buckets = overlap.buckets
    order = [(layer, block) for layer in reversed(range(len(buckets.parts)))
             for block in range(len(buckets.parts[layer]))]
    rng = np.random.default_rng(comm.rank)
    for step in range(2):
        x, y = rng.random((5, 9), dtype=np.float32), rng.integers(0, 4, 5)
        m.loss_and_grad(x, y, **overlap.backward_hooks(step))
        overlap(step)
        got = m.grads.flat.copy()
        # the same gradient (the same row blocks), then every bucket blocking, in backward order
        m.loss_and_grad(x, y, on_ready=lambda i, k: None, row_blocks=buckets.row_blocks)
        for layer, block in order:
            for key, view in buckets.parts[layer][block]:
                collectives.compressed_allreduce(view, reference, out=view, op="avg",
                                                 strategy=strategy, comm=comm, key=key,
                                                 step=step, algorithm="ring")
        assert np.array_equal(got.view(np.uint32), m.grads.flat.view(np.uint32)), (spec, step)
    a, b = ours.state_dict(), reference.state_dict()
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), spec


def test_tiny_adpsgd_run():
    """--sync adpsgd (AD-PSGD: an atomic pairwise average with a random ring neighbor after
    every step) trains; every step moves the parameters to and from one peer (2n bytes, none
    at one rank); the consensus distance is reported, the same on every rank."""
    comm = WORLD
    s = train([*TINY, "--sync", "adpsgd"], comm)
    assert np.isfinite(s["loss"]) and s["exchanges"] == s["steps"]
    assert s["bytes_mean"] == s["steps"] * 2 * s["params"] * 4 * (comm.size > 1)
    spread = comm.allgather(s["consensus"])
    assert spread == [spread[0]] * comm.size and np.isfinite(spread[0])
    if comm.size == 1:
        assert spread[0] == 0


def test_adpsgd_checkpoint_restores_every_rank():
    """--sync adpsgd: a checkpoint holds every rank's own parameters (read from its window once
    no average is under way) and momentum; resuming puts them back into each rank's window and
    optimizer, at the saved step."""
    comm = WORLD
    d = _shared_dir(comm)
    argv = [*TINY, "--sync", "adpsgd", "--checkpoint-dir", d]
    assert train([*argv, "--checkpoint-every", "3", "--stop-after", "3"], comm) is None
    comm.Barrier()
    saved = checkpoint.read(os.path.join(d, checkpoint.FILENAME))
    pre = parse([*argv, "--resume"], comm.size, 10**12)
    ds = datasets.load(pre.args.dataset, pre.args.subset)
    t = Trainer(parse([*argv, "--resume"], comm.size, len(ds.y_train)), ds, comm)
    t.restore(*checkpoint.load(d, *t.expected(), comm, check=t.check_state))
    me = f"rank{comm.rank}/"
    assert t.step == 3
    assert np.array_equal(t.model.params.flat, saved[me + "params"])
    assert np.array_equal(t.exchange.pairwise.value, saved[me + "params"])
    assert np.array_equal(t.opt.velocity, saved[me + "momentum"])
    if comm.size > 1:  # the replicas differ: each rank got its own
        ranks = [saved[f"rank{r}/params"] for r in range(comm.size)]
        assert any(not np.array_equal(ranks[0], x) for x in ranks[1:])
    t.exchange.close()
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d)


def test_tiny_choco_run_sends_less_than_plain_gossip():
    """--sync gossip:ring --codec topk (CHOCO-SGD): trains, reports its consensus distance, and
    sends less than the same gossip uncompressed (a 10 % top-k payload per neighbor)."""
    comm = WORLD
    plain = train([*TINY, "--sync", "gossip:ring"], comm)
    s = train([*TINY, "--sync", "gossip:ring", "--codec", "topk:ratio=0.1", "--gamma", "0.3"],
              comm)
    assert np.isfinite(s["loss"]) and s["exchanges"] == s["steps"]
    assert np.isfinite(s["consensus"])
    if comm.size > 1:
        assert 0 < s["bytes_mean"] < plain["bytes_mean"] / 3, (s["bytes_mean"], plain["bytes_mean"])


@pytest.mark.parametrize("codec", ["topk:ratio=0.1", "qsgd"])
def test_choco_resume_is_bitwise(codec):
    """--sync gossip:ring --codec (CHOCO-SGD) stopped after 4 steps and resumed from the
    checkpoint of step 3 ends with the bits of the unstopped run: each rank's public copies
    (one per in-neighbor and its own) and, for QSGD, its codec's private generator are saved."""
    comm = WORLD
    d = _shared_dir(comm)
    # two epochs: at 7 and 8 ranks one epoch of the tiny set is only 4 steps
    args = [*TINY, "--epochs", "2", "--sync", "gossip:ring", "--codec", codec, "--gamma", "0.3",
            "--checkpoint-dir", d]
    whole = np.load(_params(comm, train, [*args], d, "whole.npy"))
    assert train([*args, "--checkpoint-every", "3", "--stop-after", "4"], comm) is None
    comm.Barrier()
    saved = checkpoint.read(os.path.join(d, checkpoint.FILENAME))
    d_in = len(topology.ring(comm.size).in_neighbors(comm.rank))
    assert saved[f"rank{comm.rank}/choco/hats"].shape[0] == 1 + d_in
    resumed = np.load(_params(comm, train, [*args, "--resume"], d, "resumed.npy"))
    assert np.array_equal(whole, resumed)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d)


@pytest.mark.world_sizes(1, 2, 3, 4)  # one node, unequal and equal nodes
@pytest.mark.parametrize("inter", ["ring", "full"])
def test_gossip_between_nodes_is_the_flat_round_with_one_replica_per_node(monkeypatch, inter):
    """--sync gossip:nodes:INTER over emulated nodes of 2 ranks (COLLECTIVES_NODE_SIZE): every
    rank of a node ends with the same bits (the hierarchical round gives them one result), the
    run follows the flat rounds over the same topology to rounding, and the consensus distance
    is 0 where a round is the exact average."""
    comm = WORLD
    monkeypatch.setenv("COLLECTIVES_NODE_SIZE", "2")
    argv = [*TINY, "--sync", f"gossip:nodes:{inter}"]
    t = _trainer(argv, comm)
    assert t.exchange.by_nodes and t.exchange.topology.name.startswith("hierarchical(")
    assert t.train() is True
    flat = _trainer(argv, comm)
    flat.exchange.by_nodes = False  # the same topology, every round the flat one
    assert flat.train() is True
    mine = t.model.params.flat
    assert np.allclose(mine, flat.model.params.flat, rtol=1e-4, atol=1e-6)
    everyone = comm.allgather(mine.tobytes())
    for r in range(comm.size):
        assert everyone[r] == everyone[r - r % 2], f"rank {r} differs from its node's first"
    # one round is the exact average where the nodes have one size and are at most two, or
    # all joined (Metropolis-Hastings weights between nodes: V = 1/m); else the replicas differ
    nodes, equal = (comm.size + 1) // 2, comm.size % 2 == 0 or comm.size == 1
    spread = t.history[-1]["consensus"]
    if equal and (nodes <= 2 or inter == "full"):
        assert spread < 1e-6
    else:
        assert spread > 0


@pytest.mark.mpi(min_size=2)
def test_consensus_distance_from_sampled_coordinates():
    """The consensus distance estimated from K coordinates (``--consensus-coords``): the same
    on every rank; averaged over many draws of the coordinates, the estimated square equals the
    square from all coordinates (unbiased, within 3 standard errors); from K >= n coordinates,
    or 0, it is the exact one."""
    comm = WORLD
    t = _trainer([*TINY, "--sync", "gossip:ring", "--consensus-coords", "0"], comm)
    assert t.coords is None
    n = t.model.params.flat.size
    rng = np.random.default_rng([comm.rank, 7])
    t.model.params.flat[...] = rng.standard_normal(n) * (1 + np.arange(n) % 5)  # uneven terms
    exact = t.consensus(t.average())
    assert comm.allgather(exact) == [exact] * comm.size and exact > 0
    draws = np.random.default_rng(11)
    squares = []
    for _ in range(400):
        t.coords = np.sort(draws.choice(n, 50, replace=False))
        squares.append(t.consensus(None) ** 2)
    assert comm.allgather(squares[-1]) == [squares[-1]] * comm.size
    mean, sem = np.mean(squares), np.std(squares) / np.sqrt(len(squares))
    assert abs(mean - exact ** 2) < 3 * sem, (mean, exact ** 2, sem)
    for k in (n, n + 5):
        sampled = _trainer([*TINY, "--sync", "gossip:ring", "--consensus-coords", str(k)], comm)
        assert sampled.coords is None
    some = _trainer([*TINY, "--sync", "gossip:ring", "--consensus-coords", "50"], comm)
    assert some.coords.size == 50 and np.all(np.diff(some.coords) > 0)
    assert comm.allgather(some.coords.tobytes()) == [some.coords.tobytes()] * comm.size


#: one command line per mode of the table (and the variants that run another round), and what
#: one step leaves each rank: "average" (every rank the exact average), "own" (the own update:
#: --overlap mixes x0, equal everywhere) or "mixed" (something of the neighbors')
ONE_STEP = [
    (["--sync", "sync"], "average"),
    (["--sync", "sync", "--overlap", "--bucket-mb", "0.0002"], "average"),
    (["--sync", "local:1"], "average"),
    (["--sync", "gossip:ring"], "mixed"),
    (["--sync", "gossip:full"], "average"),
    (["--sync", "gossip:ring", "--overlap"], "own"),
    (["--sync", "gossip:ring", "--codec", "topk:ratio=0.5", "--gamma", "0.5"], "mixed"),
    (["--sync", "gossip:nodes"], "mixed"),
    (["--sync", "sgp"], "mixed"),
    (["--sync", "adpsgd"], "mixed"),
    (["--sync", "ssp:0"], "average"),
    (["--sync", "async"], "average"),
]


@pytest.mark.parametrize("argv, kept_is", ONE_STEP, ids=[" ".join(a) for a, _ in ONE_STEP])
def test_one_step_of_every_mode_moves_the_mean_by_the_averaged_update(argv, kept_is):
    """Every mode of the table, one step from the same parameters x0 on every rank: the mean of
    the parameters the ranks keep (the server's, or each rank's own: what a checkpoint saves)
    moves by the mean of the ranks' updates -lr * g, g each rank's gradient of its first batch
    computed apart, at x0 or, where the mode reads the parameters before the step (a server or
    window peers may have written already: async, adpsgd), at what it read (each mode's mixing
    is doubly stochastic, or its sums conserve the total). Where the exchange is an exact
    average every rank keeps exactly that; where it mixes x0 every rank keeps its own update;
    where it mixes the updated parameters some rank keeps another value than its own."""
    from collectives.sgd import sync
    from collectives.sgd.model import MLP

    comm = WORLD
    t = _trainer([*TINY, "--warmup-epochs", "0", "--lr", "5", *argv], comm)
    assert type(t.exchange) is sync.MODES[argv[1].partition(":")[0]]
    x0 = t.model.params.flat.astype(np.float64)
    assert comm.allgather(x0.tobytes()) == [x0.tobytes()] * comm.size
    order = data.shard(len(t.ds.y_train), comm.size, comm.rank, t.args.seed, 0)
    batch = order[:t.args.batch_size]
    t.one_step(order)
    reference = MLP(t.sizes, seed=t.args.seed)
    if t.exchange.pulled is not None:
        reference.params.flat[...] = t.exchange.pulled
    reference.loss_and_grad(t.ds.x_train[batch], t.ds.y_train[batch])
    own = -t.schedule(0) * reference.grads.flat.astype(np.float64)
    update = comm.allreduce(own) / comm.size
    tol = 8 * np.finfo(np.float32).eps * np.abs(x0).max()
    assert np.abs(update).max() > 1000 * tol  # a step far above rounding
    kept = t.exchange.saved_params().astype(np.float64)
    mean = comm.allreduce(kept) / comm.size
    assert np.allclose(mean - x0, update, rtol=1e-3, atol=tol), np.abs(mean - x0 - update).max()
    if kept_is == "average":
        assert np.allclose(kept - x0, update, rtol=1e-3, atol=tol)
    elif kept_is == "own":
        assert np.allclose(kept - x0, own, rtol=1e-3, atol=tol)
    elif comm.size > 1:
        assert comm.allreduce(np.abs(kept - x0 - own).max(), op=MPI.MAX) > 100 * tol
    t.exchange.close()
