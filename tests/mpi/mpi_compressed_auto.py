"""codec="auto:<spec>": the decision per tensor, the same on every rank, and what switching does.

- every rank decides the same although each rank's own inputs (the cost model, the codec speed,
  its tuning file) differ: rank 0's are used;
- a tensor switching from the codec to dense and back keeps error feedback's invariant: what was
  sent over all steps plus the final residual is the sum of the inputs, exactly (integer data);
- where the model says dense, the results are dense's, bit for bit;
- bad spellings raise ValueError, listing the valid forms, on every rank.
"""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import compress
from collectives import AutoCompression, CodecSpeed, CompressionState
from collectives.selection import clear_cache
from collectives.selection.cost_model import Network
from reference import assert_identical_everywhere

# One decision per tensor, agreed by rank 0's inputs: one rank, two, and an odd number cover it
# (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3)

FREE = CodecSpeed(0.0, 0.0, 0.0)
SLOW_LINK = Network(alpha=1e-6, beta=1e-8, gamma=0.0)    # 100 MB/s: compressing pays
FAST_LINK = Network(alpha=1e-6, beta=1e-13, gamma=0.0)   # 10 TB/s: it never does
SIZES = (16, 4000)  # the first too small to gain at any speed (a payload's header), the other not


def _state(ratio=0.05, **auto):
    state = CompressionState.of(compress.get("topk", ratio=ratio), error_feedback=True)
    state.auto = AutoCompression(**auto)
    return state


def _decisions(state):
    return {k: (v["compress"], v["dense_s"], v["compressed_s"])
            for k, v in state.auto.summary().items()}


def test_decisions_agree_although_each_rank_gives_other_inputs():
    """Rank 0 gives a slow link and a free codec (compress where a payload is smaller), the
    others a fast link and a slow codec (never): every rank follows rank 0, blocking and
    non-blocking, and the results are the same bits everywhere."""
    comm = MPI.COMM_WORLD
    mine = dict(network=SLOW_LINK, speed=FREE) if comm.rank == 0 else \
        dict(network=FAST_LINK, speed=CodecSpeed(1.0, 1.0, 1.0))
    state = _state(**mine)
    for n in SIZES:
        x = np.arange(n, dtype=np.float32) * (comm.rank + 1)
        y = collectives.compressed_allreduce(x, state, key=f"b{n}", algorithm="ring")
        assert_identical_everywhere(y, comm, n)
        y = collectives.icompressed_allreduce(x, state, key=f"i{n}",
                                              algorithm="ring").wait(timeout=120)
        assert_identical_everywhere(y, comm, n)
    got = _decisions(state)
    assert all(d == got for d in comm.allgather(got))
    if comm.size > 1:  # rank 0's inputs decide: the small tensor dense, the large one compressed
        assert [got[f"b{n}"][0] for n in SIZES] == [False, True]
        assert [got[f"i{n}"][0] for n in SIZES] == [False, True]


def test_decisions_agree_although_each_rank_reads_another_tuning_file(tmp_path_factory):
    """Each rank points COLLECTIVES_TUNING_FILE at its own file, whose codec speed for top-k
    differs (only rank 0's measures it fast): rank 0's file decides, on every rank."""
    comm = MPI.COMM_WORLD
    path = tmp_path_factory.mktemp(f"rank{comm.rank}") / "tuning.json"
    speed = 0.0 if comm.rank == 0 else 1.0
    path.write_text(json.dumps({
        "format": "collectives-tuning", "version": 1, "world_sizes": {},
        "codecs": {"topk:ratio=0.05": {"encode": speed, "decode": speed, "payload": speed}}}))
    old = os.environ.get("COLLECTIVES_TUNING_FILE")
    os.environ["COLLECTIVES_TUNING_FILE"] = str(path)
    clear_cache()
    sub = comm.Dup()  # a communicator whose auto has not read a tuning file yet
    try:
        state = _state(network=SLOW_LINK)  # the link given alike; the speed from the file
        x = np.arange(4000, dtype=np.float32) + comm.rank
        y = collectives.compressed_allreduce(x, state, key="g", comm=sub, algorithm="ring")
        assert_identical_everywhere(y, comm, "tuning file")
        got = state.auto.decisions["g"]
        assert all(d == (got.compress, got.speed_source)
                   for d in comm.allgather((got.compress, got.speed_source)))
        assert got.speed_source.startswith("measured")
        assert got.compress == (comm.size > 1)
    finally:
        collectives.reset(sub)
        sub.Free()
        if old is None:
            os.environ.pop("COLLECTIVES_TUNING_FILE")
        else:
            os.environ["COLLECTIVES_TUNING_FILE"] = old
        clear_cache()


@pytest.mark.parametrize("strategy", ["allgather", "sparse"])
def test_switching_keeps_the_error_feedback_invariant(strategy):
    """Top-k with error feedback on integer-valued data, op="sum": the density set per step
    makes auto compress (5 %) or send dense (100 %: a payload larger than the tensor). Over the
    steps, the results plus every rank's final residual add up to the sum of all inputs exactly;
    a dense step leaves no residual."""
    comm = MPI.COMM_WORLD
    state = _state(network=SLOW_LINK, speed=FREE)
    rng = np.random.default_rng(comm.rank + 7)
    ratios = [0.05, 0.05, 1.0, 0.05, 1.0, 1.0, 0.05, 0.05]
    sent = np.zeros(997, np.float64)
    given = np.zeros(997, np.float64)
    chosen = []
    for step, ratio in enumerate(ratios):
        state.codec.ratio = ratio
        x = rng.integers(-8, 9, 997).astype(np.float32)
        y = collectives.compressed_allreduce(x, state, op="sum", key="g", step=step,
                                             strategy=strategy, algorithm="ring")
        assert_identical_everywhere(y, comm, step)
        sent += y
        given += x
        chosen.append(state.auto.decisions["g"].compress)
        if not chosen[-1]:
            assert state.memory.residual("g") is None, step
    if comm.size > 1:
        assert chosen == [r < 1 for r in ratios]
    residual = state.memory.residual("g")
    left = np.zeros(997, np.float64) if residual is None else residual.astype(np.float64)
    total_left = comm.allreduce(left)
    total_given = comm.allreduce(given)
    np.testing.assert_array_equal(sent + total_left, total_given)


@pytest.mark.parametrize("algorithm", ["ring", "auto"])
def test_a_model_that_says_dense_gives_dense_bits(algorithm):
    """With a link no codec beats, every step is the dense allreduce of the same algorithm, bit
    for bit (-0.0 included: no residual is ever added), and no residual is kept; the string
    spec, on one machine's built-in model, likewise."""
    comm = MPI.COMM_WORLD
    state = _state(network=FAST_LINK)
    rng = np.random.default_rng(comm.rank)
    for step in range(3):
        x = rng.standard_normal(3001).astype(np.float32)
        x[::7] = -0.0
        got = collectives.compressed_allreduce(x, state, key="d", step=step, algorithm=algorithm)
        want = collectives.allreduce(x, op="avg", algorithm=algorithm)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), step
        assert not state.memory.state_dict()
        got = collectives.compressed_allreduce(x, "auto:topk:ratio=0.01", algorithm=algorithm)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), step
    assert state.auto.decisions["d"].calls_dense == 3


@pytest.mark.parametrize("spec, match", [
    ("auto", "auto needs the codec"), ("auto:", "auto needs the codec"),
    ("auto:auto:topk", "not another auto"), ("auto:none", "dense already"),
    ("auto:nosuch", "unknown codec 'nosuch'"), ("auto:topk:k=3", "no parameter 'k'"),
    ("auto:topk:ratio=abc", "takes a number")])
def test_bad_auto_spellings_raise_on_every_rank(spec, match):
    x = np.ones(8, np.float32)
    for call in (collectives.compressed_allreduce, collectives.icompressed_allreduce):
        with pytest.raises(ValueError, match=match) as info:
            call(x, spec)
        assert '"auto:topk:ratio=0.01"' in str(info.value)  # the valid forms
    y = collectives.compressed_allreduce(x, "fp16", op="sum")  # the ranks are still in step
    np.testing.assert_array_equal(y, np.full(8, MPI.COMM_WORLD.size, np.float32))
