"""compressed_allreduce against a reference that decodes every rank's payload and aggregates.

Every codec x every strategy that can run it, on COMM_WORLD, a split communicator and COMM_SELF;
results bitwise identical on every rank; bytes on the wire counted exactly where the schedule
fixes them, and below dense fp32 where compression should cut them.
"""

import gc
import re
import types
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import compress
from collectives.compressed.api import CompressedAllreduceCall
from collectives.compressed.strategies import AUTO_ORDER, STRATEGIES, strategy_for
from reference import codec_data, make_codec as codec_of, assert_identical_everywhere, gather_all

# The strategies' oracles (every codec x strategy, summable) at every size; the codecs' state,
# bytes and errors at one to four ranks (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3, 4)

PARAMS = {"topk": dict(ratio=0.1), "threshold": dict(tau=0.5), "dgc": dict(density=0.1,
                                                                             sample_ratio=0.5)}
STRATEGIES_FOR = {
    name: ["allgather", "two_phase"]
    + (["sparse", "sparse_recursive_doubling", "sparse_split"]
       if name in ("topk", "threshold", "dgc") else [])
    for name in compress.CODECS
}


def make_codec(name, rank):
    """The same codec on every rank, except private seeds (reference.make_codec)."""
    return codec_of(name, rank, PARAMS)


data = codec_data


def reference(name, x, comm, op, key, step=0, encoder=None):
    """Decode every rank's payload (from a fresh, identical codec, or ``encoder``: a fresh
    memory around one) and aggregate in float64."""
    encoder = make_codec(name, comm.rank) if encoder is None else encoder
    payload = encoder.encode(x, key=key, step=step)
    decoded = [make_codec(name, 0).decode(pl).astype(np.float64)
               for pl in comm.allgather(payload)]
    total = np.sum(decoded, axis=0)
    if compress.CODECS[name].aggregation == "majority":
        return np.sign(total)
    return total / comm.size if op == "avg" else total


def two_phase_reference(name, x, comm, op, key, encoder=None):
    """The two-phase schedule simulated with plain calls: chunk payloads (from ``encoder``, a
    fresh memory, if given), server re-encode."""
    p = comm.size
    encoder = make_codec(name, comm.rank) if encoder is None else encoder
    codec = getattr(encoder, "codec", encoder)  # a memory's codec draws the server's noise too
    bounds = np.cumsum([0] + [len(a) for a in np.array_split(np.empty(x.size), p)])
    chunks = [encoder.encode(x[bounds[i]:bounds[i + 1]], key=f"{key}#chunk{i}", step=0)
              for i in range(p)]
    everyone = comm.allgather(chunks)
    decoder = make_codec(name, 0)
    mine = [decoder.decode(everyone[k][comm.rank]) for k in range(p)]
    acc = mine[0].astype(np.float32)
    for d in mine[1:]:
        acc = acc + d
    if codec.aggregation == "majority":
        acc = np.sign(acc)
    elif op == "avg":
        acc = acc / p
    reply = codec.recompressor().encode(acc.astype(x.dtype), key=f"{key}#chunk{comm.rank}", step=0)
    return np.concatenate([decoder.decode(r) for r in comm.allgather(reply)])


@pytest.mark.world_sizes()  # every size: an oracle of the strategies
@pytest.mark.parametrize("name", list(compress.CODECS))
def test_every_strategy_matches_reference(name, comm):
    for strategy in STRATEGIES_FOR[name]:
        for n in (0, 1, comm.size + 1, 1001):
            for op in ("avg", "sum"):
                x = data(n, comm.rank)
                codec = make_codec(name, comm.rank)
                key = f"{name}/{strategy}/{n}/{op}"  # per-key state (server error feedback) per shape
                y = collectives.compressed_allreduce(x, codec, op=op, strategy=strategy, key=key,
                                                     comm=comm)
                what = f"{name} {strategy} p={comm.size} n={n} {op}"
                assert y.shape == x.shape and y.dtype == x.dtype, what
                assert_identical_everywhere(y, comm, what)
                if strategy == "two_phase" and comm.size > 1:
                    ref = two_phase_reference(name, x, comm, op, key)
                else:
                    ref = reference(name, x, comm, op, key)
                scale = max(1.0, float(np.abs(ref).max(initial=0)))
                assert np.allclose(y, ref, rtol=1e-5, atol=1e-5 * scale), \
                    f"{what}: max diff {np.abs(y - ref).max(initial=0)}"


@pytest.mark.world_sizes()  # every size: an oracle of the strategies
@pytest.mark.parametrize("name", ["none", "fp16", "bf16", "randomk"])
def test_summable_strategy(name, comm):
    tol = {"none": 1e-6, "fp16": 2e-3, "bf16": 2e-2, "randomk": 1e-6}[name]
    for n in (0, 1, comm.size + 1, 1001):
        for op in ("avg", "sum"):
            x = data(n, comm.rank, 1)
            assert strategy_for(make_codec(name, 0)) == "summable"
            y = collectives.compressed_allreduce(x, make_codec(name, comm.rank), op=op, key="s",
                                                 step=5, comm=comm)
            ref = reference(name, x, comm, op, "s", step=5)
            bound = tol * comm.size * max(1.0, float(np.abs(gather_all(x, comm)).max(initial=0)))
            assert np.abs(y - ref).max(initial=0) <= bound, f"{name} {op} n={n}"
            assert_identical_everywhere(y, comm, name)


def test_powersgd_full_rank_is_exact_mean():
    """With rank >= the matrix's columns, one power step reproduces the mean matrix exactly."""
    comm = MPI.COMM_WORLD
    x = data(6 * 4, comm.rank, 2).reshape(6, 4)
    codec = compress.get("powersgd", rank=4, seed=7, min_compression_rate=0)  # factor even so
    assert codec.compresses(x.shape, x.dtype)
    y = collectives.compressed_allreduce(x, codec, key="w")
    mean = gather_all(x, comm).astype(np.float64).mean(axis=0).reshape(6, 4)
    assert np.allclose(y, mean, atol=1e-4), np.abs(y - mean).max()
    assert_identical_everywhere(y, comm, "powersgd")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_powersgd_with_error_feedback_in_place_equals_out_of_place(dtype):
    """The low-rank rounds write P_hat Q^T straight into ``out`` (which may be ``x`` itself) and
    the residual into compensate's array: in place, out of place and into a separate ``out``
    give the same bits for two steps, and the residual is the compensated input minus the
    result (PyTorch's rule), for float16 too (whose factors are float32: no direct write)."""
    comm = MPI.COMM_WORLD
    xs = [data(24 * 40, comm.rank, 11 + s).reshape(24, 40).astype(dtype) for s in range(2)]
    results = {}
    for how in ("new", "out", "in_place"):
        ef = compress.ErrorFeedback(compress.get("powersgd", rank=2, seed=3))
        got = []
        for step, x in enumerate(xs):
            x = x.copy()
            before = x.astype(np.float64) + (0 if step == 0 else
                                             ef.residual("ip").astype(np.float64))
            out = {"new": None, "out": np.empty_like(x), "in_place": x}[how]
            y = collectives.compressed_allreduce(x, ef, op="avg", key="ip", out=out)
            assert y.dtype == dtype and y.shape == x.shape
            if out is not None:
                assert y is out
            if comm.size > 1:
                tol = 2e-2 if dtype == np.float16 else 1e-5
                assert np.allclose(ef.residual("ip"), before - y.astype(np.float64), atol=tol)
            got.append(y.copy())
        results[how] = got
    for how in ("out", "in_place"):
        for a, b in zip(results["new"], results[how]):
            assert a.tobytes() == b.tobytes(), how
    assert_identical_everywhere(results["in_place"][1], comm, "powersgd")


@pytest.mark.parametrize("shape", [(1001,), (5, 5)])
def test_powersgd_sends_what_does_not_gain_as_it_is(shape):
    """A 1-d tensor (a bias) or a matrix too small to gain is allreduced uncompressed: the result
    and the bytes sent are those of the identity codec, and the warm start keeps nothing."""
    comm = MPI.COMM_WORLD
    x = data(int(np.prod(shape)), comm.rank, 10).reshape(shape)
    codec = compress.get("powersgd", rank=2, seed=1)
    assert not codec.compresses(shape, x.dtype)
    sent = []
    for c in (codec, compress.get("none")):
        before = collectives.TRAFFIC.bytes_sent
        sent.append((collectives.compressed_allreduce(x, c, key="b", algorithm="ring"),
                     collectives.TRAFFIC.bytes_sent - before))
    np.testing.assert_array_equal(sent[0][0], sent[1][0])
    assert sent[0][1] == sent[1][1], sent
    assert codec.state_dict() == {}


def test_powersgd_rank_one_is_rank_one():
    comm = MPI.COMM_WORLD
    x = data(8 * 5, comm.rank, 3).reshape(8, 5)
    y = collectives.compressed_allreduce(x, compress.get("powersgd", rank=1, seed=7), key="w1")
    assert np.linalg.matrix_rank(y.astype(np.float64), tol=1e-4) <= 1


def test_allgather_bytes_on_the_wire_are_exact():
    """Ring allgather: rank r sends every 8-byte size and every payload but rank r+1's."""
    comm = MPI.COMM_WORLD
    codec = compress.get("topk", ratio=0.05)
    x = data(4001, comm.rank, 4)
    sizes = comm.allgather(codec.encode(x, key="b").size)
    before = collectives.TRAFFIC.bytes_sent
    collectives.compressed_allreduce(x, codec, strategy="allgather", key="b")
    sent = collectives.TRAFFIC.bytes_sent - before
    expected = 0 if comm.size == 1 else \
        sum(sizes) - sizes[(comm.rank + 1) % comm.size] + 8 * (comm.size - 1)
    assert sent == expected, (sent, expected)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["sparse_recursive_doubling", "sparse_split", "two_phase"])
def test_compression_cuts_bytes(strategy):
    comm = MPI.COMM_WORLD
    n = 200_001
    codec = compress.get("topk", ratio=0.01) if strategy != "two_phase" else \
        compress.get("efsignsgd")
    x = data(n, comm.rank, 5)
    before = collectives.TRAFFIC.bytes_sent
    collectives.compressed_allreduce(x, codec, strategy=strategy, key="c")
    sent = collectives.TRAFFIC.bytes_sent - before
    dense_ring = 2 * (comm.size - 1) / comm.size * n * 4
    assert sent < dense_ring / 4, (strategy, sent, dense_ring)


def test_error_feedback_residual_through_sparse():
    """With ErrorFeedback, what a rank's payload dropped comes back in its next call."""
    comm = MPI.COMM_WORLD
    ef = compress.ErrorFeedback(compress.get("topk", ratio=0.1))
    x = data(501, comm.rank, 6)
    collectives.compressed_allreduce(x, ef, strategy="sparse", key="ef")
    sent = compress.get("topk", ratio=0.1).decode(compress.get("topk", ratio=0.1).encode(x))
    assert np.allclose(ef.residual("ef"), x - sent)


BAD = [
    (lambda: collectives.compressed_allreduce(np.ones(4, np.float32), 42), TypeError,
     "compress codec"),  # a codec spec is a string: "topk" is accepted
    (lambda: collectives.compressed_allreduce(np.ones(4, np.int32), compress.get("fp16")),
     TypeError, "does not take dtype int32"),
    (lambda: collectives.compressed_allreduce(np.ones(4, np.float32), compress.get("fp16"),
                                              op="max"), ValueError, "op must be one of"),
    (lambda: collectives.compressed_allreduce(np.ones(4, np.float32), compress.get("topk"),
                                              strategy="summable"), ValueError, "not summable"),
    (lambda: collectives.compressed_allreduce(np.ones(4, np.float32), compress.get("topk"),
                                              strategy="bogus"), ValueError, "valid choices"),
    (lambda: collectives.compressed_allreduce(np.ones(4, np.float32), compress.get("topk"),
                                              step=-1), ValueError, "step"),
    (lambda: collectives.compressed_allreduce(np.ones(4, np.float32), compress.get("topk"),
                                              out=np.ones(3, np.float32)), ValueError, "shape"),
    (lambda: collectives.compressed_allreduce(np.ones(4, np.float32),
                                              compress.DGCMemory(compress.get("fp16")),
                                              strategy="summable"), ValueError, "DGCMemory"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises_on_every_rank(case):
    call, kind, text = BAD[case]
    with pytest.raises(kind) as info:
        call()
    assert text in str(info.value)


@pytest.mark.mpi(min_size=2)
def test_validate_catches_codec_mismatch():
    comm = MPI.COMM_WORLD
    codec = compress.get("topk" if comm.rank == 0 else "signsgd")
    with pytest.raises(ValueError, match="arguments differ across ranks"):
        collectives.compressed_allreduce(np.ones(8, np.float32), codec, validate=True)


@pytest.mark.parametrize("name", ["fp16", "randomk", "powersgd"])
def test_error_feedback_through_summable(name):
    """ErrorFeedback around a summable codec: the residual is what this rank's part lost."""
    comm = MPI.COMM_WORLD
    ef = compress.ErrorFeedback(make_codec(name, comm.rank))
    x = data(12 * 40, comm.rank, 7).reshape(12, 40)  # a matrix PowerSGD factors
    y = collectives.compressed_allreduce(x, ef, op="avg", key="efs")
    residual = ef.residual("efs")
    assert residual is not None and residual.shape == x.shape
    if name == "powersgd" and comm.size > 1:  # PyTorch's rule: input minus the aggregate
        assert np.allclose(residual, x - y, atol=1e-5)
    elif name != "powersgd":
        own = make_codec(name, 0).summable_decode(
            make_codec(name, 0).summable_encode(x.reshape(-1) / comm.size, key="efs", step=0),
            shape=x.shape, dtype=x.dtype, key="efs")
        assert np.allclose(residual, x - own * comm.size, atol=1e-6)
    # the next call adds the residual back: feeding zeros sends exactly the residual
    z = collectives.compressed_allreduce(np.zeros_like(x), ef, op="avg", key="efs")
    assert np.isfinite(z).all()
    assert_identical_everywhere(z, comm, name)


@pytest.mark.parametrize("name,strategy", [("topk", "allgather"), ("topk", "sparse"), ("threshold", "sparse_split"),
                                           ("topk", "sparse_recursive_doubling"), ("fp16", "summable"),
                                           ("bf16", "summable"), ("randomk", "summable"),
                                           ("powersgd", "summable"), ("efsignsgd", "allgather"),
                                           ("efsignsgd", "two_phase"), ("qsgd", "two_phase")])
def test_device_input_gives_the_same_result_on_the_device(name, strategy, backend):
    """CuPy in, CuPy out, with what the NumPy path gives: the codecs run on the device, and their
    payloads are byte-identical to host ones, except float sums that set a scale (the device adds in
    another order) and PowerSGD's QR. The sparse strategy merges its lists on the host."""
    to_device, to_host = backend
    comm = MPI.COMM_WORLD
    x = data(1001, comm.rank, 8)
    # a fresh codec per call: the state of each (two_phase's server-side residuals) starts empty
    y_host = collectives.compressed_allreduce(x, make_codec(name, comm.rank), key="dh", strategy=strategy)
    y_dev = collectives.compressed_allreduce(to_device(x), make_codec(name, comm.rank), key="dh",
                                             strategy=strategy)
    assert type(y_dev) is type(to_device(x))
    if name in ("efsignsgd", "qsgd", "powersgd"):
        np.testing.assert_allclose(to_host(y_dev), y_host, rtol=1e-4, atol=1e-5)
    else:
        np.testing.assert_array_equal(to_host(y_dev), y_host)
    assert_identical_everywhere(to_host(y_dev), comm, name)


@pytest.mark.parametrize("name,strategy", [("efsignsgd", "two_phase"), ("topk", "sparse"),
                                           ("qsgd", "allgather"), ("powersgd", "summable"),
                                           ("randomk", "summable")])
def test_state_dict_resumes_bit_for_bit(name, strategy):
    """Everything a compressed allreduce keeps is in state.state_dict(): a fresh state loaded from
    it continues exactly as the original (error feedback, server-side residuals, PowerSGD's Q,
    private generators, the step)."""
    comm = MPI.COMM_WORLD

    def fresh():
        return collectives.CompressionState.of(make_codec(name, comm.rank), error_feedback=None)

    xs = [data(6 * 167, comm.rank, 20 + i).reshape(6, 167) for i in range(4)]

    def steps(state, batch):
        out = []
        for x in batch:
            out.append(collectives.compressed_allreduce(x, state, key="w", strategy=strategy))
            state.step += 1
        return out

    first = fresh()
    steps(first, xs[:2])
    saved = {k: np.array(v, copy=True) for k, v in first.state_dict().items()}
    if comm.size > 1 and name == "efsignsgd":
        assert any(k.startswith("server/error/") for k in saved), sorted(saved)
    assert int(saved["step"]) == 2
    resumed = fresh()
    resumed.load_state_dict(saved)
    assert sorted(resumed.state_dict()) == sorted(saved)
    for a, b in zip(steps(first, xs[2:]), steps(resumed, xs[2:])):
        np.testing.assert_array_equal(a, b)


def test_dgc_memory_is_not_dropped_by_auto():
    """A DGCMemory around a summable codec goes through a strategy that encodes with it."""
    memory = compress.DGCMemory(compress.get("fp16"), momentum=0.5)
    state = collectives.CompressionState.of(memory)
    assert strategy_for(state.codec, state.memory) == "allgather"
    collectives.compressed_allreduce(data(64, MPI.COMM_WORLD.rank, 9), memory, key="m")
    assert "m" in memory.state


def test_bare_codec_keeps_server_residuals_like_a_state():
    """A bare codec's server-side residuals persist across calls, as an explicit state's do, and
    the communicator does not keep the codec alive."""
    comm = MPI.COMM_WORLD
    bare = compress.get("efsignsgd")
    state = collectives.CompressionState(compress.get("efsignsgd"))
    for i in range(3):
        x = data(1001, comm.rank, 30 + i)
        a = collectives.compressed_allreduce(x, bare, key="b", strategy="two_phase")
        b = collectives.compressed_allreduce(x, state, key="b", strategy="two_phase")
        np.testing.assert_array_equal(a, b)
    assert bool(state.server.state) == (comm.size > 1)
    gone = weakref.ref(bare)
    del bare
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("name", ["fp16", "efsignsgd"])
def test_two_phase_server_compresses_its_first_aggregate_as_it_is(name):
    """Server-side error feedback starts from the aggregate itself: an aggregate of -0.0 stays
    -0.0 for a codec that keeps it (fp16), and a sign codec sends it as it sends +0.0."""
    x = np.full(8, -0.0, np.float32)
    y = collectives.compressed_allreduce(x, compress.get(name), key="z", strategy="two_phase")
    if name == "fp16":
        assert np.signbit(y).all(), y
    else:
        plus = collectives.compressed_allreduce(np.zeros(8, np.float32), compress.get(name),
                                                key="z+", strategy="two_phase")
        np.testing.assert_array_equal(y.view(np.uint32), plus.view(np.uint32))


@pytest.mark.world_sizes(1, 2, 3)  # "on every rank": one, two and an odd number
@pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflow is expected, not warned about
@pytest.mark.parametrize("bad", [np.inf, np.nan, -np.inf], ids=["inf", "nan", "inf-and-minus-inf"])
@pytest.mark.parametrize("name", list(compress.CODECS))
def test_nonfinite_on_one_rank_reaches_every_rank(name, bad):
    """Mixed precision: one rank's gradient overflowed (or two, to +inf and -inf: their sum is
    NaN). With every codec and every strategy that runs it, every rank's result holds inf or NaN
    (so every rank's loss scaler skips the step), bitwise the same everywhere, never a hang, a
    'malformed payload' or a warning; the state (error feedback, server residuals, PowerSGD's warm
    start) is not poisoned: the next finite step is finite."""
    comm = MPI.COMM_WORLD
    for strategy in collectives.STRATEGIES:
        state = collectives.CompressionState.of(make_codec(name, comm.rank), error_feedback=None)
        if not STRATEGIES[strategy].applies(state.codec, state.memory):
            continue
        what = f"{name} {strategy} {bad} p={comm.size}"
        x = data(6 * 40, comm.rank, 40).reshape(6, 40)  # a matrix PowerSGD factors
        if comm.rank == 0 and bad == -np.inf:
            x[2, 17] = -np.inf
        if comm.rank == comm.size - 1:
            x[2, 17] = abs(bad)
        y = collectives.compressed_allreduce(x, state, key="w", strategy=strategy)
        assert not np.isfinite(y).all(), what
        assert_identical_everywhere(y, comm, what)
        state.step += 1
        z = collectives.compressed_allreduce(data(6 * 40, comm.rank, 41).reshape(6, 40), state,
                                             key="w", strategy=strategy)
        assert np.isfinite(z).all(), f"{what}: the step after the overflow is not finite"
        assert_identical_everywhere(z, comm, what)


UNBIASED = {name: compress.CODECS[name] for name in compress.CODECS if compress.get(name).unbiased}
UNBIASED_TRIALS = 80


def _unbiased_codec(name, rank):
    if name == "randomk":
        return compress.get("randomk", ratio=0.5, seed=1, unbiased_scaling=True)
    return make_codec(name, rank)


@pytest.mark.world_sizes(2, 3)
@pytest.mark.parametrize("name", sorted(UNBIASED) + ["randomk"])
def test_unbiased_codecs_stay_unbiased_through_every_strategy(name):
    """E[result] = the exact mean, through every strategy the codec can take (two_phase once
    scaled random-k's values twice: at p = 3, 1.5 became 2.25). The mean of the trials is
    compared with the exact mean, per element, in standard errors (seeds are fixed: the verdict
    is deterministic)."""
    comm = MPI.COMM_WORLD
    n = 2 * comm.size + 3
    x = 1 + data(n, comm.rank, 7) / 2  # mostly positive: a wrong scale shows as a bias
    exact = gather_all(x, comm).astype(np.float64).mean(axis=0)
    for strategy in collectives.STRATEGIES:
        codec = _unbiased_codec(name, comm.rank)
        if not STRATEGIES[strategy].applies(codec):
            continue
        runs = np.array([collectives.compressed_allreduce(x, codec, key="u", step=t,
                                                          strategy=strategy)
                         for t in range(UNBIASED_TRIALS)], dtype=np.float64)
        for errors in (runs - exact, (runs - exact).mean(axis=1, keepdims=True)):  # each, pooled
            err = errors.mean(axis=0)
            sem = errors.std(axis=0, ddof=1) / np.sqrt(UNBIASED_TRIALS)
            z = np.abs(err) / np.maximum(sem, 1e-12)
            assert np.all((z < 5.5) | (np.abs(err) < 1e-5)), \
                f"{name} {strategy} p={comm.size}: biased, z = {np.round(z, 1)}"


@pytest.mark.world_sizes()  # every size: an oracle of the strategies
@pytest.mark.parametrize("inter", ["ring", "native"])
def test_summable_runs_on_every_dense_algorithm(inter):
    """algorithm= of the summable strategy takes every name collectives.ALGORITHMS has:
    "hierarchical" raised KeyError after the argument check; bf16 words never reach MPI.SUM,
    across nodes either."""
    comm = MPI.COMM_WORLD
    opts = collectives.Options(node_size=2, inter_algorithm=inter)
    for name in ("none", "fp16", "bf16", "randomk", "powersgd"):
        x = data(6 * 40, comm.rank, 3).reshape(6, 40)
        ref = collectives.compressed_allreduce(x, make_codec(name, comm.rank), key="h",
                                               strategy="summable", algorithm="ring")
        for algorithm in collectives.ALGORITHMS:
            if algorithm == "shm" and comm.size > 2:  # one node only; these span nodes of 2
                continue
            y = collectives.compressed_allreduce(x, make_codec(name, comm.rank), key="h",
                                                 strategy="summable", algorithm=algorithm,
                                                 options=opts)
            what = f"{name} {algorithm} inter={inter} p={comm.size}"
            assert_identical_everywhere(y, comm, what)
            assert np.allclose(y, ref, rtol=2e-2, atol=2e-2), what


@pytest.mark.parametrize("spec", ["fp16", "topk:ratio=0.5", "qsgd:levels=7,bucket=16,seed=3"])
def test_codec_specs_through_every_compressed_entry_point(spec):
    """A codec spec (what DistributedOptimizer, the DDP hook and --codec take) is the state
    ``CompressionState.from_spec(spec, rank=rank)`` builds (its codec bare; private randomness
    seeded from (seed, rank)), new at every call: blocking and non-blocking calls give what
    that state gives."""
    comm = MPI.COMM_WORLD
    x = data(1001, comm.rank, 41)
    expected = collectives.compressed_allreduce(
        x, collectives.CompressionState.from_spec(spec, rank=comm.rank), key="s")
    got = collectives.compressed_allreduce(x, spec, key="s")
    np.testing.assert_array_equal(got, expected)
    got = collectives.icompressed_allreduce(x, spec, key="s").wait(timeout=120)
    np.testing.assert_array_equal(got, expected)
    assert_identical_everywhere(got, comm, spec)


@pytest.mark.parametrize("spec, match", [("nosuch", "unknown codec"),
                                         ("topk:ratio=2", "ratio"),
                                         ("topk:speed=3", "speed")])
def test_bad_codec_specs_raise_at_the_call_on_every_rank(spec, match):
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match=match):
        collectives.compressed_allreduce(x, spec)
    with pytest.raises(ValueError, match=match):
        collectives.icompressed_allreduce(x, spec)
    y = collectives.compressed_allreduce(x, "fp16", op="sum")  # the ranks are still in step
    np.testing.assert_array_equal(y, np.full(8, MPI.COMM_WORLD.size, np.float32))


@pytest.mark.parametrize("spec", ["powersgd:rank=2", "topk:ratio=0.1"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_start_step_is_dense_until_then(spec, dtype):
    """CompressionState(start_step=2), as PyTorch's start_powerSGD_iter: steps 0 and 1 give what
    the dense allreduce gives (the same algorithm, bit for bit) and leave the memory empty; step
    2 compresses, from a memory that saw nothing of the dense steps."""
    comm = MPI.COMM_WORLD
    state = collectives.CompressionState.of(compress.from_spec(spec), error_feedback=True)
    state.start_step = 2
    fresh = collectives.CompressionState.of(compress.from_spec(spec), error_feedback=True)
    rng = np.random.default_rng(comm.rank)
    for step in range(4):
        x = rng.standard_normal((24, 17)).astype(dtype)
        got = collectives.compressed_allreduce(x, state, op="avg", step=step, key="w",
                                               algorithm="ring")
        assert_identical_everywhere(got, comm, (spec, step))
        if step < 2:
            want = collectives.allreduce(x, op="avg", algorithm="ring")
            assert np.array_equal(got, want), step
            assert not state.memory.state_dict(), step
        else:  # compression starts as a fresh state's first steps would
            want = collectives.compressed_allreduce(x, fresh, op="avg", step=step - 2, key="w",
                                                    algorithm="ring")
            if spec.startswith("topk"):
                assert np.array_equal(got, want), step
            assert state.memory.state_dict(), step


def test_start_step_must_be_a_count():
    codec = compress.get("topk")
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="start_step"):
            collectives.CompressionState(codec, start_step=bad)


# -- each strategy's rule against what running it does ---------------------------------------------
#: the summable strategy's error bound per codec (times p and the largest input), as above
SUMMABLE_TOL = {"none": 1e-6, "fp16": 2e-3, "bf16": 2e-2, "randomk": 1e-6, "powersgd": 1e-6}
MEMORIES = {"bare": None, "error_feedback": compress.ErrorFeedback,
            "dgc_memory": lambda codec: compress.DGCMemory(codec, momentum=0.5)}


def _state(name, rank, memory, auto):
    codec = make_codec(name, rank)
    wrap = MEMORIES[memory]
    return collectives.CompressionState(codec, None if wrap is None else wrap(codec),
                                        auto=collectives.AutoCompression() if auto else None)


# the rules are the codec's and memory's, not p's: 1, 2 and 3 ranks (the results at every size are
# test_every_strategy_matches_reference's)
@pytest.mark.world_sizes(1, 2, 3)
@pytest.mark.parametrize("auto", [False, True], ids=["plain", "auto"])
@pytest.mark.parametrize("memory", list(MEMORIES))
@pytest.mark.parametrize("name", list(compress.CODECS))
def test_every_strategy_runs_exactly_where_its_rule_says(name, memory, auto):
    """For every codec x memory x auto setting and every entry of STRATEGIES: where the entry's
    rule says it applies, the call runs and gives the decode-and-aggregate reference (or, where
    auto chose dense, the mean), bitwise the same on every rank; where it says it does not,
    compressed_allreduce raises ValueError with that reason on every rank. strategy="auto" runs
    the first entry of AUTO_ORDER that applies and suits the codec, with the same bits."""
    comm = MPI.COMM_WORLD
    x = data(1001, comm.rank, 50)
    ran = []
    for strategy in STRATEGIES.values():
        state = _state(name, comm.rank, memory, auto)
        key = f"rule/{name}/{memory}/{auto}/{strategy.name}"
        what = f"{key} p={comm.size}"
        reason = strategy.why_not(state.codec, state.memory, auto=auto)
        assert strategy.applies(state.codec, state.memory, auto=auto) == (reason is None), what
        assert comm.allgather(reason) == [reason] * comm.size, what
        if reason is not None:
            with pytest.raises(ValueError, match=re.escape(reason)):
                collectives.compressed_allreduce(x, state, key=key, strategy=strategy.name)
            assert not state.memory or not state.memory.state_dict(), what  # nothing ran
            continue
        ran.append(strategy.name)
        y = collectives.compressed_allreduce(x, state, key=key, strategy=strategy.name)
        assert_identical_everywhere(y, comm, what)
        if auto and not state.auto.decisions[key].compress:  # the cost model chose dense
            mean = gather_all(x, comm).astype(np.float64).mean(axis=0)
            assert np.allclose(y, mean, rtol=1e-5, atol=1e-6), what
            continue
        fresh = _state(name, comm.rank, memory, False).encoder
        if strategy.name == "two_phase" and comm.size > 1:
            ref = two_phase_reference(name, x, comm, "avg", key, encoder=fresh)
        else:
            ref = reference(name, x, comm, "avg", key, encoder=fresh)
        scale = max(1.0, float(np.abs(gather_all(x, comm)).max()))
        if strategy.name == "summable":  # scaled by 1/p before encoding
            assert np.abs(y - ref).max() <= SUMMABLE_TOL[name] * comm.size * scale, what
        else:
            assert np.allclose(y, ref, rtol=1e-5, atol=1e-5 * scale), \
                f"{what}: max diff {np.abs(y - ref).max()}"
    assert "allgather" in ran and ("two_phase" in ran) == (not auto)
    base = _state(name, comm.rank, memory, auto)
    chosen = strategy_for(base.codec, base.memory, auto=auto)
    assert chosen in AUTO_ORDER and STRATEGIES[chosen].applies(base.codec, base.memory, auto=auto)
    assert all(not (STRATEGIES[s].applies(base.codec, base.memory, auto=auto)
                    and STRATEGIES[s].suits(base.codec))
               for s in AUTO_ORDER[:AUTO_ORDER.index(chosen)])
    by_auto = collectives.compressed_allreduce(x, base, key="auto-pick")
    named = collectives.compressed_allreduce(x, _state(name, comm.rank, memory, auto),
                                             key="auto-pick", strategy=chosen)
    np.testing.assert_array_equal(by_auto, named)


# -- one spec builder ------------------------------------------------------------------------------
BUILDER_SPECS = ["qsgd:levels=7", "terngrad:seed=5", "dgc:density=0.1", "natural",
                 "randomk:ratio=0.1", "powersgd:rank=2", "topk:ratio=0.1", "auto:qsgd",
                 "auto:randomk:ratio=0.2,seed=9"]


def _site_states(spec, comm):
    """The state each entry point makes of ``spec`` on this rank: compressed_allreduce's spec
    path, the PyTorch integration, the SGD driver and the benchmark tools; None for the PyTorch
    one where torch is not installed."""
    from collectives.tools.osu.compressed import codec_state
    from collectives.sgd.cli import parse
    from collectives.sgd.driver import Trainer

    x = np.zeros(8, np.float32)
    api = CompressedAllreduceCall(comm, x, spec, None, "avg", "auto", None, None, "auto",
                                  collectives.Options()).codec
    try:
        from collectives.torch._common import make_state
    except ImportError:
        torch = None
    else:
        torch = make_state(spec, None, rank=comm.rank)
    args = parse(["--codec", spec], comm.size, 1000).args
    sgd = Trainer.build(types.SimpleNamespace(args=args, world=comm.size, spe=10), comm.rank)
    return {"api": api, "torch": torch, "sgd": sgd, "bench": codec_state(spec, comm.rank)}


def _params(codec):
    """The codec's parameters, its seed (an int, or a per-rank generator) left out."""
    names = compress.registry.parameters(codec.name)
    return {k: v for k, v in vars(codec).items() if k in names and k != "seed"}


def _payload(state, x):
    return np.asarray(state.codec.encode(x, key="w", step=3)).tobytes()


@pytest.mark.parametrize("spec", BUILDER_SPECS)
def test_every_entry_point_builds_the_same_state_from_a_spec(spec):
    """compressed_allreduce's spec path, the PyTorch integration, the SGD driver (--seed 0) and
    the benchmark tools all make CompressionState.from_spec's state: the same codec, parameters,
    generator and payloads, the same auto setting, error feedback as each asks; private
    randomness from SeedSequence((seed, rank)) (a spec's seed= replacing the base seed), shared
    randomness from the seed, the same on every rank."""
    comm = MPI.COMM_WORLD
    states = {site: s for site, s in _site_states(spec, comm).items() if s is not None}
    want = collectives.CompressionState.from_spec(spec, rank=comm.rank, error_feedback=None)
    x = data(1001, comm.rank, 60)
    for site, state in states.items():
        what = f"{spec} {site} rank {comm.rank}"
        assert type(state.codec) is type(want.codec), what
        assert _params(state.codec) == _params(want.codec), what
        assert (state.auto is None) == (want.auto is None) and state.start_step == 0, what
        got, expected = state.codec.state_dict(), want.codec.state_dict()
        assert sorted(got) == sorted(expected), what
        assert all(np.array_equal(got[k], expected[k]) for k in got), what
        # the api's spec path keeps the codec bare; the others wrap it where it needs it
        wrapped = want.codec.needs_error_feedback and site != "api"
        assert isinstance(state.memory, compress.ErrorFeedback) if wrapped \
            else state.memory is None, what
    payloads = {site: _payload(state, x) for site, state in states.items()}
    assert len(set(payloads.values())) == 1, f"{spec}: {sorted(payloads)} differ"
    codec = want.codec
    name, params = compress.parse_spec(spec.removeprefix("auto:"))
    seed = params.get("seed", 0)
    everyone = comm.allgather(_payload(collectives.CompressionState.from_spec(
        spec, rank=comm.rank), np.ones(1001, np.float32)))
    if codec.randomness == "private":
        mine = np.random.default_rng(np.random.SeedSequence((seed, comm.rank)))
        assert codec.generator.bit_generator.state == mine.bit_generator.state, spec
        states_everywhere = comm.allgather(codec.generator.bit_generator.state)
        assert len({repr(s) for s in states_everywhere}) == comm.size, spec
    elif codec.randomness == "shared":
        assert codec.seed == seed, spec
        assert everyone == [everyone[0]] * comm.size, spec  # the same draw on every rank
