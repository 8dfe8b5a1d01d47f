"""compressed_reduce_scatter and compressed_allgather against decode-and-aggregate references.

The reduce-scatter's references gather every rank's per-block payloads (made by a fresh,
identical codec: ``compress`` alone, no collective), decode rank ``r``'s column and sum it in rank
order, as the strategy promises; the summable strategy's sums, made in the representation's
precision, are held to a bound. The allgather's reference decodes every rank's payload: every
rank, the owner included, holds those bits. Bytes on the wire are counted exactly; error
feedback keeps what was not sent; bad arguments raise on every rank before any message.
"""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import compress
from collectives.compressed.strategies import (SCATTER_AUTO_ORDER, SCATTER_STRATEGIES,
                                               scatter_strategy_for)
from reference import codec_data, make_codec as codec_of, assert_identical_everywhere, counts_for, gather_all

# the strategies' oracles, bytes and state at 1-5 ranks (blocks of count / p, odd p, a rank with an
# empty block); the errors, "on every rank", at 1-3 (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3, 4, 5)

PARAMS = {"topk": dict(ratio=0.1), "threshold": dict(tau=0.5),
          "dgc": dict(density=0.1, sample_ratio=0.5), "eightbit": dict(bucket=16)}
#: the summable strategy's error bound per codec (times p and the largest input): sums in the
#: representation's precision (fp16, bf16) against the decoded float32 sums of the reference
SUMMABLE_TOL = {"none": 1e-6, "fp16": 2e-3, "bf16": 2e-2, "randomk": 1e-6, "powersgd": 1e-6}


def make_codec(name, rank):
    """The same codec on every rank, except private seeds (reference.make_codec)."""
    return codec_of(name, rank, PARAMS)


data = codec_data


def uneven(n, p, salt=0):
    """Deterministic uneven counts summing to ``n``, the last block empty where p > 1."""
    if p == 1:
        return [n]
    cuts = np.sort(np.random.default_rng([n, p, salt]).integers(0, n + 1, p - 2))
    sizes = np.diff(np.concatenate([[0], cuts, [n]])).tolist()
    return sizes + [0]


def cases(p):
    """(n, counts) pairs: the sweep's counts with the near-equal split, and uneven ones."""
    out = [(n, None) for n in counts_for(p)]
    out += [(n, uneven(n, p)) for n in (p + 1, 1001)]
    return out


def offsets_of(n, counts, p):
    sizes = [len(a) for a in np.array_split(np.empty(n), p)] if counts is None else counts
    return np.cumsum([0] + list(sizes)).tolist()


def scatter_reference(name, x, offsets, comm, op, key, encoder=None):
    """Block ``rank`` of the aggregate: every rank's payload of block ``i`` (sub-key
    ``key#chunk{i}``, from a fresh codec or ``encoder``, a fresh memory around one) decoded by
    rank ``i`` and summed in rank order in float32, as ``aggregate_into`` does."""
    p, r = comm.size, comm.rank
    encoder = make_codec(name, r) if encoder is None else encoder
    payloads = [encoder.encode(x[offsets[i]:offsets[i + 1]], key=f"{key}#chunk{i}", step=0)
                for i in range(p)]
    column = [row[r] for row in comm.allgather(payloads)]
    decoder = make_codec(name, 0)
    count = offsets[r + 1] - offsets[r]
    acc = None
    for pl in column:
        d = decoder.decode(pl, count=count)
        acc = d.astype(np.result_type(d.dtype, np.float32)) if acc is None else acc + d
    if decoder.aggregation == "majority":
        acc = np.sign(acc)
    elif op == "avg":
        acc = acc / p
    return acc.astype(x.dtype), [pl.size for pl in payloads]


def strategies_for(name):
    codec = make_codec(name, 0)
    return [s for s, entry in SCATTER_STRATEGIES.items() if entry.applies(codec)]


@pytest.mark.parametrize("name", list(compress.CODECS))
def test_reduce_scatter_matches_reference(name):
    """Every codec x every strategy that runs it x counts 0, 1, p-1, p+1, 1001 and uneven ones
    (an empty block among them): "alltoall" gives the decode-and-sum reference's bits, "summable"
    stays within its precision's bound; "auto" is the first entry of SCATTER_AUTO_ORDER that
    applies."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    strategies = strategies_for(name)
    assert scatter_strategy_for(make_codec(name, 0)) == strategies[0]
    assert strategies == [s for s in SCATTER_AUTO_ORDER if s in strategies]
    for strategy in strategies:
        for k, (n, counts) in enumerate(cases(p)):
            op = ("avg", "sum")[k % 2]
            shape = (n,) if name != "powersgd" or n != 1001 else (7, 143)  # a matrix it factors
            x = data(n, r, k).reshape(shape)
            key = f"{name}/{strategy}/{n}/{counts}"
            what = f"{name} {strategy} p={p} n={n} counts={counts} {op}"
            y = collectives.compressed_reduce_scatter(x, make_codec(name, r), op=op,
                                                      counts=counts, strategy=strategy, key=key)
            off = offsets_of(n, counts, p)
            assert y.shape == (off[r + 1] - off[r],) and y.dtype == x.dtype, what
            if strategy == "alltoall":
                ref, _ = scatter_reference(name, x.reshape(-1), off, comm, op, key)
                np.testing.assert_array_equal(y, ref, err_msg=what)
            elif name == "powersgd" and make_codec(name, 0).compresses(shape, x.dtype):
                # the summable allreduce's block, bit for bit
                whole = collectives.compressed_allreduce(x, make_codec(name, r), op=op, key=key,
                                                         strategy="summable")
                np.testing.assert_array_equal(y, whole.reshape(-1)[off[r]:off[r + 1]],
                                              err_msg=what)
            else:
                ref, _ = scatter_reference(name, x.reshape(-1), off, comm, op, key)
                scale = max(1.0, float(np.abs(gather_all(x.reshape(-1), comm)).max(initial=0)))
                bound = SUMMABLE_TOL[name] * p * scale
                assert np.abs(y - ref).max(initial=0) <= bound, what


@pytest.mark.parametrize("name", ["fp16", "bf16", "eightbit", "qsgd", "topk"])
def test_allgather_is_every_decoded_shard_bitwise_everywhere(name):
    """Every rank, the owner included, holds every rank's decoded payload (not its own x):
    the reference's bits, the same bytes on every rank, at every count and uneven shards."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    for k, (n, counts) in enumerate(cases(p)):
        sizes = [n] * p if counts is None else counts
        x = data(sizes[r], r, 10 + k)
        key = f"ag/{name}/{n}/{counts}"
        y = collectives.compressed_allgather(x, make_codec(name, r), counts=counts, key=key)
        what = f"{name} p={p} sizes={sizes}"
        assert y.shape == (sum(sizes),) and y.dtype == x.dtype, what
        payload = make_codec(name, r).encode(x, key=key)
        decoder = make_codec(name, 0)
        ref = np.concatenate([decoder.decode(pl, count=c).reshape(-1)
                              for pl, c in zip(comm.allgather(payload), sizes)])
        np.testing.assert_array_equal(y, ref, err_msg=what)
        assert_identical_everywhere(y, comm, what)
        if name in ("fp16", "bf16", "eightbit") and sizes[r] >= 16:  # the quantized view, not x
            mine = y[sum(sizes[:r]):sum(sizes[:r + 1])]
            assert not np.array_equal(mine, x) and np.allclose(mine, x, rtol=1e-2, atol=0.05), \
                what


def test_nonblocking_forms_give_the_blocking_bits():
    """icompressed_reduce_scatter and icompressed_allgather run the same calls on the
    progress engine: the same bits as the blocking functions."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    x = data(1001, r, 20)
    counts = uneven(1001, p, 1)
    for name in ("topk", "qsgd", "fp16"):
        want = collectives.compressed_reduce_scatter(x, make_codec(name, r), counts=counts,
                                                     key="nb")
        req = collectives.icompressed_reduce_scatter(x, make_codec(name, r), counts=counts,
                                                     key="nb", name=f"rs.{name}")
        np.testing.assert_array_equal(req.wait(timeout=120), want, err_msg=name)
    shard = data(counts[r], r, 21)
    for name in ("bf16", "eightbit"):
        want = collectives.compressed_allgather(shard, name, counts=counts)
        got = collectives.icompressed_allgather(shard, name, counts=counts).wait(timeout=120)
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert_identical_everywhere(got, comm, name)


@pytest.mark.world_sizes(2)  # the device path; the host tests above cover every p
@pytest.mark.parametrize("name,strategy", [("topk", "alltoall"), ("fp16", "alltoall"),
                                           ("fp16", "summable"), ("bf16", "summable"),
                                           ("efsignsgd", "alltoall"), ("eightbit", "allgather"),
                                           ("bf16", "allgather")])
def test_device_input_gives_the_host_bits(name, strategy, backend):
    """CuPy in, CuPy out, with the bits the NumPy path gives (the codecs encode and decode on
    the device; payloads are the host's bytes), the same on every rank."""
    to_device, to_host = backend
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    counts = uneven(1001, p, 6)
    if strategy == "allgather":
        x = data(counts[r], r, 70)
        host = collectives.compressed_allgather(x, make_codec(name, r), counts=counts, key="d")
        dev = collectives.compressed_allgather(to_device(x), make_codec(name, r), counts=counts,
                                               key="d")
        assert_identical_everywhere(to_host(dev), comm, name)
    else:
        x = data(1001, r, 70)
        host = collectives.compressed_reduce_scatter(x, make_codec(name, r), counts=counts,
                                                     strategy=strategy, key="d")
        dev = collectives.compressed_reduce_scatter(to_device(x), make_codec(name, r),
                                                    counts=counts, strategy=strategy, key="d")
    assert type(dev) is type(to_device(x))
    np.testing.assert_array_equal(to_host(dev), host, err_msg=f"{name} {strategy}")


@pytest.mark.parametrize("name", ["topk", "efsignsgd", "fp16"])
def test_reduce_scatter_bytes_on_the_wire_are_exact(name):
    """"alltoall": rank r sends 8 bytes of size and its payload of block i to every rank i != r;
    "summable" (fp16): a ring reduce-scatter of the representation sends every block but this
    rank's own, 2 bytes an element."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    n, counts = 3001, uneven(3001, p, 2)
    x = data(n, r, 30)
    off = offsets_of(n, counts, p)
    for strategy in strategies_for(name):
        _, sizes = scatter_reference(name, x, off, comm, "avg", "b")
        before = collectives.TRAFFIC.bytes_sent
        collectives.compressed_reduce_scatter(x, make_codec(name, r), counts=counts,
                                              strategy=strategy, key="b")
        sent = collectives.TRAFFIC.bytes_sent - before
        if strategy == "alltoall":
            expected = sum(8 + sizes[i] for i in range(p) if i != r)
        else:
            expected = 2 * (n - counts[r]) if p > 1 else 0
        assert sent == expected, (name, strategy, sent, expected)


def test_allgather_bytes_on_the_wire_are_exact():
    """Ring allgatherv: rank r sends every 8-byte size and every payload but rank r+1's."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    counts = uneven(4001, p, 3)
    x = data(counts[r], r, 31)
    codec = compress.get("eightbit", bucket=64)
    sizes = comm.allgather(codec.encode(x, key="b").size)
    before = collectives.TRAFFIC.bytes_sent
    collectives.compressed_allgather(x, codec, counts=counts, key="b")
    sent = collectives.TRAFFIC.bytes_sent - before
    expected = 0 if p == 1 else sum(sizes) - sizes[(r + 1) % p] + 8 * (p - 1)
    assert sent == expected, (sent, expected)
    dense = 4 * (4001 - counts[(r + 1) % p]) if p > 1 else 0  # what float32 would have sent
    assert comm.allreduce(sent) <= comm.allreduce(dense) / 3, (sent, dense)  # int8, a scale/64


@pytest.mark.parametrize("name,strategy", [("topk", "alltoall"), ("qsgd", "alltoall"),
                                           ("eightbit", "alltoall"), ("fp16", "summable"),
                                           ("randomk", "summable")])
def test_error_feedback_keeps_what_was_not_sent(name, strategy):
    """With ErrorFeedback (one residual per destination block), over several steps: what
    arrived (every rank's block of the sum, gathered) plus every rank's residuals is the sum of
    every rank's inputs, to float32 rounding: |difference| <= 1e-5 x steps x p x max|x| (each
    step's sum and residual are float32), plus, for the summable strategy, the sum made in the
    representation's precision (fp16: SUMMABLE_TOL x steps x p x max|x|): error feedback keeps
    what each rank's own representation lost, not the rounding of the sum."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    n, counts, steps = 1001, uneven(1001, p, 4), 5
    ef = compress.ErrorFeedback(make_codec(name, r))
    arrived = np.zeros(n, np.float64)
    inputs = np.zeros(n, np.float64)
    for t in range(steps):
        x = data(n, r, 40 + t)
        y = collectives.compressed_reduce_scatter(x, ef, op="sum", counts=counts, key="w",
                                                  step=t, strategy=strategy)
        arrived += np.concatenate([np.asarray(b, np.float64)
                                   for b in comm.allgather(y)])
        inputs += gather_all(x, comm).astype(np.float64).sum(axis=0)
    residual = np.concatenate([ef.residual(f"w#chunk{i}") for i in range(p)]).astype(np.float64)
    assert residual.shape == (n,) and {k for k in ef.state} == {f"w#chunk{i}" for i in range(p)}
    assert np.abs(residual).max() > 0
    held = gather_all(residual.astype(np.float32), comm).astype(np.float64).sum(axis=0)
    tol = 1e-5 + (SUMMABLE_TOL[name] if strategy == "summable" else 0)
    bound = tol * steps * p * float(np.abs(inputs).max())
    assert np.abs(arrived + held - inputs).max() <= bound, np.abs(arrived + held - inputs).max()


def test_powersgd_reduce_scatter_keeps_the_whole_tensor_residual():
    """PowerSGD factors the whole matrix: its residual is the tensor's, under the key
    (PyTorch's rule: the compensated input minus the aggregate), and each rank's block is the
    block of the aggregate."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    ef = compress.ErrorFeedback(make_codec("powersgd", r))
    x = data(12 * 40, r, 50).reshape(12, 40)
    y = collectives.compressed_reduce_scatter(x, ef, op="avg", key="m")
    off = offsets_of(x.size, None, p)
    whole = np.concatenate(comm.allgather(y))
    assert ef.residual("m").shape == x.shape
    if p > 1:
        np.testing.assert_allclose(ef.residual("m").reshape(-1), x.reshape(-1) - whole,
                                   atol=1e-5)
    assert y.size == off[r + 1] - off[r]


def test_start_step_is_the_dense_reduce_scatter():
    """CompressionState(start_step=1): step 0 is collectives.reduce_scatter's bits (ring, the
    same op), and leaves the memory empty; step 1 compresses."""
    comm = MPI.COMM_WORLD
    counts = uneven(1001, comm.size, 5)
    state = collectives.CompressionState.of(compress.get("topk", ratio=0.1), error_feedback=True)
    state.start_step = 1
    x = data(1001, comm.rank, 60)
    got = collectives.compressed_reduce_scatter(x, state, counts=counts, step=0, key="d")
    want = collectives.reduce_scatter(x, op="avg", counts=counts, algorithm="ring")
    np.testing.assert_array_equal(got, want)
    assert not state.memory.state_dict()
    collectives.compressed_reduce_scatter(x, state, counts=counts, step=1, key="d")
    assert state.memory.state_dict()


def _x():
    return np.ones(2 * MPI.COMM_WORLD.size + 3, np.float32)


BAD = [
    (lambda: collectives.compressed_reduce_scatter(_x(), "nosuch"), ValueError, "unknown codec"),
    (lambda: collectives.compressed_allgather(_x(), "nosuch"), ValueError, "unknown codec"),
    (lambda: collectives.compressed_reduce_scatter(_x(), "powersgd", strategy="alltoall"),
     ValueError, "factors the whole matrix"),
    (lambda: collectives.compressed_allgather(_x(), "powersgd"), ValueError, "factors a matrix"),
    (lambda: collectives.compressed_reduce_scatter(_x(), "auto:topk"), ValueError,
     "auto compression cannot run"),
    (lambda: collectives.compressed_allgather(_x(), "auto:fp16"), ValueError,
     "auto compression cannot run"),
    (lambda: collectives.compressed_reduce_scatter(_x(), "topk", strategy="summable"),
     ValueError, "not summable"),
    (lambda: collectives.compressed_reduce_scatter(_x(), "topk", strategy="bogus"), ValueError,
     "valid choices"),
    (lambda: collectives.compressed_reduce_scatter(
        _x(), compress.DGCMemory(compress.get("fp16")), strategy="summable"), ValueError,
     "DGCMemory"),
    (lambda: collectives.compressed_reduce_scatter(_x(), "fp16", counts=[1] * MPI.COMM_WORLD.size),
     ValueError, "counts sum to"),
    (lambda: collectives.compressed_reduce_scatter(_x(), "fp16", counts=[1, 2, 3, 4, 5, 6]),
     ValueError, "non-negative integers"),
    (lambda: collectives.compressed_reduce_scatter(_x(), "fp16", op="max"), ValueError,
     "op must be one of"),
    (lambda: collectives.compressed_reduce_scatter(_x(), "fp16", out=np.empty(1001, np.float32)),
     ValueError, "shape"),
    (lambda: collectives.compressed_reduce_scatter(np.ones(4, np.int32), "fp16"), TypeError,
     "does not take dtype int32"),
    (lambda: collectives.compressed_allgather(_x(), "fp16", counts=[0] * MPI.COMM_WORLD.size),
     ValueError, "but x has"),
    (lambda: collectives.compressed_reduce_scatter(_x(), "topk", step=-1), ValueError, "step"),
    (lambda: collectives.icompressed_reduce_scatter(_x(), "powersgd", strategy="alltoall"),
     ValueError, "factors the whole matrix"),
    (lambda: collectives.icompressed_allgather(_x(), "nosuch"), ValueError, "unknown codec"),
]


@pytest.mark.world_sizes(1, 2, 3)  # "on every rank": the error paths' sizes (docs/testing.md)
@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises_on_every_rank(case):
    """The same error on every rank, from the checks before any message; the ranks are still in
    step afterwards."""
    comm = MPI.COMM_WORLD
    call, kind, text = BAD[case]
    with pytest.raises(kind) as info:
        call()
    assert text in str(info.value)
    assert comm.allgather(type(info.value).__name__) == [kind.__name__] * comm.size
    y = collectives.compressed_reduce_scatter(np.ones(comm.size, np.float32), "fp16", op="sum")
    np.testing.assert_array_equal(y, [comm.size])


@pytest.mark.world_sizes(2, 3)
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("what", ["reduce_scatter", "allgather"])
def test_counts_that_differ_across_ranks_raise_on_every_rank(what, validate):
    """Counts that differ (each summing to x.size on its rank; every rank's split different):
    with validate=True the signatures are compared before any message and every rank raises
    the same ValueError; without it every rank still raises ValueError, never a hang or a
    result: a payload's header says how many elements it holds, and the decoder checks that
    against the count the receiver expects."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    match = "arguments differ across ranks" if validate else "payload holds"
    if what == "reduce_scatter":
        counts = [2] * p
        counts[r % p], counts[(r + 1) % p] = 1, 3  # a different split on each rank
        with pytest.raises(ValueError, match=match):
            collectives.compressed_reduce_scatter(np.ones(2 * p, np.float32), "fp16",
                                                  counts=counts, validate=validate)
    else:
        counts = [1] * p
        counts[(r + 1) % p] = 2  # every rank claims a different rank holds two
        with pytest.raises(ValueError, match=match):
            collectives.compressed_allgather(np.ones(1, np.float32), "fp16", counts=counts,
                                             validate=validate)
    y = collectives.compressed_reduce_scatter(np.ones(p, np.float32), "fp16", op="sum")
    np.testing.assert_array_equal(y, [p])  # the ranks are in step again
