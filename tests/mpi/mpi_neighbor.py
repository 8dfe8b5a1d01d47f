"""Neighbor collectives (one gossip round) under real multi-rank runs.

Every graph of the catalogue, Metropolis-Hastings weights, the hierarchical graph over emulated
nodes and a user's random graph, through both backends, against the plain reference (gather
every rank's array, apply the weight matrix in NumPy); the same bits on every repetition, in
place, and through the progress engine; consensus at the rate the spectral gap predicts; bytes
counted; bad input and a failing or late rank raising on every rank that needs it.
"""

import re
import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.decentralized import topology as T
from reference import gather_all

BACKENDS = list(collectives.decentralized.neighbor.BACKENDS)
try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 is then not tested here
    BF16 = None
FLOATS = [np.float64, np.float32, np.float16] + ([BF16] if BF16 is not None else [])


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


def _custom(p):
    """A user's graph: a ring plus random chords (seeded: the same on every rank), MH weights."""
    rng = np.random.default_rng(p)
    adj = T.ring(p).weights() > 0
    chords = rng.random((p, p)) < 0.3
    adj = adj | chords | chords.T
    return T.from_adjacency(adj, weights="metropolis", name="chords")


def _topologies(comm):
    p = comm.size
    tops = [T.build(name, p) for name in T.GRAPHS]
    tops += [T.ring(p, "metropolis"), T.hierarchical_for(comm, "ring", node_size=2), _custom(p)]
    return tops


def _reference(x, topology, step, comm):
    """Gather every rank's array and mix with W in float64: row ``rank`` of ``W @ X``; the
    rounding bound (float16 and bfloat16 accumulate in float32 and round once: one half ulp
    of their own precision, plus float32's for each term)."""
    rows = gather_all(x, comm).astype(np.float64)
    w = topology.weights(step)
    ref = w[comm.rank] @ rows
    scale = np.abs(w[comm.rank]) @ np.abs(rows)
    terms = (w[comm.rank] > 0).sum()
    if x.dtype in (np.float32, np.float64):
        bound = 4 * terms * float(np.finfo(x.dtype).eps) * scale
    else:
        own = 2.0 ** -8 if x.dtype == BF16 else float(np.finfo(np.float16).eps)
        bound = own * np.abs(ref) + 4 * terms * float(np.finfo(np.float32).eps) * scale
    return ref.reshape(x.shape), bound.reshape(x.shape), rows


def test_matches_reference_bitwise_repeatable_and_in_place(comm):
    """Every topology, step of its period and float dtype: the result is within rounding of
    W @ X; for float32, a second call gives the same bits; out=x gives the same bits in place;
    neighbor_allgather returns exactly the in-neighbors' arrays; the "mpi" backend gives the
    same bits as "p2p" (the same combination of the same blocks)."""
    rng = np.random.default_rng(comm.rank)
    for topology in _topologies(comm):
        for step in range(topology.period):
            for dtype in FLOATS:
                what = f"{topology.name} step {step} {np.dtype(dtype).name}"
                x = rng.standard_normal((3, 7)).astype(dtype)
                y = collectives.neighbor_allreduce(x, topology, step=step, comm=comm)
                assert y.shape == x.shape and y.dtype == x.dtype, what
                ref, bound, rows = _reference(x, topology, step, comm)
                err = np.abs(y.astype(np.float64) - ref)
                assert (err <= bound + 1e-30).all(), f"{what}: error {err.max():g}"
                if dtype is not np.float32:
                    continue
                again = collectives.neighbor_allreduce(x, topology, step=step, comm=comm)
                assert _same_bits(y, again), f"{what}: differs on repetition"
                buf = x.copy()
                assert collectives.neighbor_allreduce(buf, topology, step=step, comm=comm,
                                                      out=buf) is buf
                assert _same_bits(buf, y), f"{what}: in place differs"
                y_mpi = collectives.neighbor_allreduce(x, topology, step=step, comm=comm,
                                                       backend="mpi")
                assert _same_bits(y_mpi, y), f"{what}: backend mpi differs from p2p"
                srcs = list(topology.in_neighbors(comm.rank, step))
                for backend in BACKENDS:
                    g = collectives.neighbor_allgather(x, topology, step=step, comm=comm,
                                                       backend=backend)
                    assert g.shape == (len(srcs), 3, 7), what
                    assert np.array_equal(g.reshape(len(srcs), 21),
                                          rows[srcs].astype(np.float32)), (what, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nonblocking_equals_blocking(comm, backend):
    """ineighbor_allreduce through the progress engine: several rounds in flight, waited in
    reverse order, each the same bits as the blocking call, on either backend."""
    topology = T.one_peer_exponential(comm.size)
    x = np.random.default_rng(comm.rank).standard_normal(33)
    steps = range(2 * topology.period)
    requests = [collectives.ineighbor_allreduce(x, topology, step=s, comm=comm, backend=backend)
                for s in steps]
    for s, req in reversed(list(zip(steps, requests))):
        blocking = collectives.neighbor_allreduce(x, topology, step=s, comm=comm, backend=backend)
        assert _same_bits(req.wait(timeout=60), blocking), (s, backend)


def test_nonblocking_allgather_equals_blocking(comm):
    """ineighbor_allgather through the progress engine: rounds of every step of a period (the
    in-neighbors change from 3 ranks) in flight together, waited in reverse order, each the
    in-neighbors' arrays in ascending source rank, as the blocking call gives them, into
    ``out`` when given; counts 0, 1 and large odd ones; both backends. (The "mpi" backend's
    distributed-graph communicators once made a later free of a communicator holding two of
    the library's attributes crash: tests/test_comm_state.py.)"""
    topology = T.one_peer_exponential(comm.size)
    rng = np.random.default_rng(comm.rank)
    for n in (0, 1, 1001):
        x = rng.standard_normal(n).astype(np.float32)
        rows = gather_all(x, comm) if n else None
        steps = range(2 * topology.period)
        for backend in BACKENDS:
            outs = [np.empty((len(topology.in_neighbors(comm.rank, s)), n), np.float32)
                    for s in steps]
            requests = [collectives.ineighbor_allgather(x, topology, step=s, comm=comm,
                                                        backend=backend, out=o)
                        for s, o in zip(steps, outs)]
            for s, req, o in reversed(list(zip(steps, requests, outs))):
                assert req.wait(timeout=60) is o, s
                blocking = collectives.neighbor_allgather(x, topology, step=s, comm=comm,
                                                          backend=backend)
                assert _same_bits(o, blocking), (n, s, backend)
                if n:
                    srcs = sorted(topology.in_neighbors(comm.rank, s))
                    assert np.array_equal(o, rows[srcs].astype(np.float32)), (n, s, backend)


def _consensus_error(x, comm):
    rows = gather_all(x, comm)
    return float(np.linalg.norm(rows - rows.mean(axis=0)))


def test_consensus_at_the_rate_of_the_spectral_gap():
    """Repeated rounds on every topology: after k rounds (whole periods) the distance to the
    exact average is at most rho^k times the first one (rho = 1 - spectral gap), and the
    average itself is kept (doubly stochastic W). One-peer exponential at a power of two
    averages exactly after one period. (The "mpi" backend gives the same bits: above.)"""
    comm = MPI.COMM_WORLD
    p = comm.size
    x0 = np.random.default_rng(100 + comm.rank).standard_normal(16)
    mean0 = gather_all(x0, comm).mean(axis=0)
    for topology in _topologies(comm):
        x = x0.copy()
        e0 = _consensus_error(x, comm)
        rounds = 2 * topology.period if topology.period > 1 else 4
        for k in range(rounds):
            collectives.neighbor_allreduce(x, topology, step=k, out=x)
        err = _consensus_error(x, comm)
        bound = topology.rho ** rounds * e0
        assert err <= bound * (1 + 1e-9) + 1e-12 * (1 + e0), \
            f"{topology.name}: after {rounds} rounds {err:g} > {bound:g}"
        assert np.allclose(gather_all(x, comm).mean(axis=0), mean0, atol=1e-12), topology.name
        if p > 1:
            assert err < e0, topology.name  # it did mix
        if topology.name.startswith("one_peer") and p & (p - 1) == 0:
            assert err < 1e-12 * (1 + e0), f"{topology.name}: not exact after a period"


def test_traffic_counts_one_message_per_out_neighbor():
    comm = MPI.COMM_WORLD
    x = np.ones(100, dtype=np.float32)
    for topology in _topologies(comm):
        before = collectives.TRAFFIC.reset()
        collectives.neighbor_allreduce(x, topology, step=0)
        sent = collectives.TRAFFIC.reset()
        collectives.TRAFFIC.bytes_sent += before.bytes_sent  # leave the counters as found
        collectives.TRAFFIC.messages += before.messages
        d = len(topology.out_neighbors(comm.rank, 0))
        assert (sent.messages, sent.bytes_sent) == (d, d * x.nbytes), topology.name


def _raises(call, kinds=(ValueError, TypeError, collectives.CollectiveError)):
    with pytest.raises(kinds) as info:
        call()
    return info.value


def _still_works(comm=MPI.COMM_WORLD):
    topology = T.full(comm.size)
    x = np.full(5, float(comm.rank))
    y = collectives.neighbor_allreduce(x, topology)
    assert np.allclose(y, (comm.size - 1) / 2)


def test_bad_arguments_raise_on_every_rank():
    """Errors every rank sees alike: raised everywhere before any message."""
    comm = MPI.COMM_WORLD
    p = comm.size
    x = np.ones(4)
    cases = [
        (lambda: collectives.neighbor_allreduce(x, T.ring(p + 1)),
         f"topology ring({p + 1}) is for {p + 1} ranks, the communicator has {p}"),
        (lambda: collectives.neighbor_allgather(x, T.ring(p + 1)), "neighbor_allgather: topology"),
        (lambda: collectives.neighbor_allreduce(x, "ring"), "must be a collectives.topology"),
        (lambda: collectives.neighbor_allreduce(np.ones(4, np.int32), T.ring(p)),
         "a weighted average needs float16, bfloat16, float32 or float64"),
        (lambda: collectives.neighbor_allreduce(x, T.ring(p), backend="nccl"),
         "unknown backend 'nccl'; valid choices: p2p, mpi"),
        (lambda: collectives.neighbor_allreduce(x, T.ring(p), out=np.ones(5)), "shape"),
        (lambda: collectives.ineighbor_allreduce(x, T.ring(p + 2)), "is for"),
        (lambda: collectives.neighbor_allreduce(x, T.ring(p), self_weight="half"),
         "self_weight must be a real number"),
        (lambda: collectives.neighbor_allreduce(x, T.ring(p), weights=[0.5]),
         "weights must be a dict {in-neighbor rank: weight}"),
    ]
    if p >= 3:  # a time-varying graph without its step
        cases.append((lambda: collectives.neighbor_allreduce(x, T.one_peer_exponential(p)),
                      "changes every step (period"))
    for call, text in cases:
        error = _raises(call)
        assert text in str(error), str(error)
    _still_works()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_weights_on_one_rank_reach_its_neighbors(backend):
    """The last rank alone passes weights that do not sum to 1 (or name other ranks): it raises
    before sending, and every rank that receives from it raises too, naming it (on the full
    graph: every rank). The next call is right. With the "mpi" backend the graph is new, so the
    others reach the collective that makes its communicator, and raise there instead of
    waiting for the failed rank."""
    comm = MPI.COMM_WORLD
    p = comm.size
    bad = p - 1
    fresh = T.from_weights(0.5 * np.eye(p) + 0.5 / p, name=f"fresh-{backend}")
    for topology in (fresh, T.ring(p)):
        mine = topology.in_neighbors(bad)
        for kwargs, text in (({"self_weight": 0.5, "weights": {j: 0.7 for j in mine}},
                              "not stochastic"),
                             ({"weights": {bad: 1.0}}, "in-neighbors")):
            if comm.rank == bad:
                error = _raises(lambda: collectives.neighbor_allreduce(
                    np.ones(6), topology, backend=backend, **kwargs))
                assert text in str(error), str(error)
                continue
            try:
                collectives.neighbor_allreduce(np.ones(6), topology, backend=backend)
                error = None
            except (ValueError, collectives.CollectiveError) as exc:
                error = exc
            if bad in topology.in_neighbors(comm.rank):
                assert error is not None and f"failed on rank {bad}" in str(error) \
                    and text in str(error), (topology.name, str(error))
        _still_works()


def test_own_weights_override_the_row():
    """self_weight alone shares the rest evenly; weights alone leave the self weight the rest;
    both agree with the reference of the overridden row."""
    comm = MPI.COMM_WORLD
    p = comm.size
    topology = T.ring(p)
    x = np.arange(4.0) + 10 * comm.rank
    rows = gather_all(x, comm)
    srcs = topology.in_neighbors(comm.rank)
    if not srcs:  # one rank: nobody to give the other half to
        error = _raises(lambda: collectives.neighbor_allreduce(x, topology, self_weight=0.5))
        assert "not stochastic: self 0.5 and in-neighbors {}" in str(error), str(error)
        return
    y = collectives.neighbor_allreduce(x, topology, self_weight=0.5)
    assert np.allclose(y, 0.5 * x + sum(0.5 / len(srcs) * rows[j] for j in srcs))
    ws = {j: 0.1 for j in srcs}
    y = collectives.neighbor_allreduce(x, topology, weights=ws)
    assert np.allclose(y, (1 - 0.1 * len(srcs)) * x + sum(0.1 * rows[j] for j in srcs))


@pytest.mark.mpi(min_size=2)
def test_count_mismatch_and_differing_steps_raise():
    """A count that differs on one rank: the ranks that receive its message raise "count or
    dtype differs"; validate=True catches a step that differs across ranks on every rank."""
    comm = MPI.COMM_WORLD
    p = comm.size
    topology = T.full(p)
    x = np.ones(5 if comm.rank == 0 else 3)
    error = _raises(lambda: collectives.neighbor_allreduce(x, topology))
    assert "count or dtype differs across ranks" in str(error), str(error)
    _still_works()
    if p >= 3:
        dynamic = T.one_peer_exponential(p)
        step = 1 if comm.rank == 0 else 0
        error = _raises(lambda: collectives.neighbor_allreduce(np.ones(3), dynamic, step=step,
                                                               validate=True))
        assert "arguments differ across ranks (step % period: rank 0: 1, rank 1: 0" in str(error), \
            str(error)
        _still_works()


@pytest.mark.world_sizes(2, 3, 4)  # each size costs the late rank's sleep; the guard is the same
@pytest.mark.mpi(min_size=2)
def test_a_late_rank_makes_its_neighbors_time_out():
    """Options.timeout: the last rank arrives after the others' deadline; on the full graph
    every other rank raises TimeoutError instead of waiting for ever; the next call is right."""
    comm = MPI.COMM_WORLD
    topology = T.full(comm.size)
    _still_works()  # set-up without a deadline
    late = comm.rank == comm.size - 1
    comm.Barrier()
    if late:
        time.sleep(0.6)
    try:
        collectives.neighbor_allreduce(np.ones(8), topology,
                                       options=collectives.Options(timeout=0.2))
        error = None
    except TimeoutError as exc:
        error = exc
    if not late:
        assert error is not None
    if error is not None:
        assert re.search(r"neighbor_allreduce #\d+ (timed out after 0.2 s|failed on rank \d+: "
                         r"TimeoutError)", str(error)), str(error)
    comm.Barrier()
    _still_works()


def _plan_cases(comm):
    """(topology, options, hierarchical): a static graph, the one-peer exponential graph (a
    new graph every step) and the hierarchical round over emulated nodes of 2."""
    nodes = collectives.Options(node_size=2)
    return [(T.ring(comm.size), None, False), (T.one_peer_exponential(comm.size), None, False),
            (T.hierarchical_for(comm, "ring", node_size=2), nodes, True)]


def test_plan_equals_neighbor_allreduce_every_round(comm):
    """neighbor_allreduce_init: runs alternate start()/wait() and the blocking plan(), x refilled
    between them; round r gives the bits of neighbor_allreduce(x, step=r) (the plan advances
    its step), into the same out, over more than one period; a plan from step 3 starts there."""
    rng = np.random.default_rng(comm.rank)
    for topology, opts, hier in _plan_cases(comm):
        x = np.empty(13)
        out = np.empty(13)
        plan = collectives.neighbor_allreduce_init(x, topology, out=out, comm=comm,
                                                   hierarchical=hier, options=opts)
        for r in range(2 * topology.period + 1):
            x[...] = rng.standard_normal(13)
            got = plan.start().wait(timeout=60) if r % 2 == 0 else plan()
            want = collectives.neighbor_allreduce(x, topology, step=r, comm=comm,
                                                  hierarchical=hier, options=opts)
            assert got is out and _same_bits(out, want), (topology.name, r)
            assert plan.step == r + 1
        plan.free()
    topology = T.one_peer_exponential(comm.size)
    x = rng.standard_normal(5).astype(np.float32)
    later = collectives.neighbor_allreduce_init(x, topology, step=3, comm=comm)
    assert _same_bits(later(), collectives.neighbor_allreduce(x, topology, step=3, comm=comm))


def test_plan_bad_use_raises():
    """Bad arguments at construction (as the blocking call), a plan started twice, x reshaped
    in place since, and any use after free(): clear errors, and nothing hangs."""
    comm = MPI.COMM_WORLD
    p = comm.size
    _raises(lambda: collectives.neighbor_allreduce_init(np.ones(4), T.ring(p + 1)))
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        collectives.neighbor_allreduce_init(np.ones(4), T.ring(p), step=-1)
    x = np.ones(6)
    plan = collectives.neighbor_allreduce_init(x, T.ring(p))
    plan.start()
    if p > 1:
        with pytest.raises(RuntimeError, match="still running: wait"):
            plan.start()
        with pytest.raises(RuntimeError, match="still running: wait"):
            plan.free()
    plan.wait(timeout=60)
    x.shape = (2, 3)
    with pytest.raises(ValueError, match=r"x has shape \(2, 3\), but the plan was made for "
                                         r"\(6,\)"):
        plan.start()
    x.shape = (6,)
    assert np.allclose(plan(), 1.0)
    plan.free()
    for use in (plan.start, plan, plan.wait):
        with pytest.raises(RuntimeError, match="plan was freed"):
            use()
    _still_works()
