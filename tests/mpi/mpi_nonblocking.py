"""Non-blocking and persistent collectives: the progress engine under real multi-rank runs.

Every algorithm and block through the non-blocking path against the gather-and-reduce reference
and bitwise identical to the blocking result (alltoall, gather, scatter and barrier: identical to
the blocking result, which tests/mpi/mpi_alltoall.py checks against references); many
outstanding requests waited in random order (and the new forms' waited last first);
waitany/test loops; persistent plans started 1000 times; requests that finish while the caller
sleeps; errors (an injected exception, a skipped operation, mismatched order under validate);
a short soak with no leaked threads, requests or engines; completion callbacks (at once when
done, else once on the engine's thread; failed operations; a raising callback; plans).
"""

import logging
import threading
import time
import traceback
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import compress
from collectives.engine import engine as engine_module, engine_of, live_engines
from collectives._runtime.ranks import partition
from collectives.algorithms import EQUAL_BLOCKS_ONLY
from reference import (assert_close, assert_identical_everywhere, counts_for, for_algorithm,
                       gather_all, make_input, reference_allreduce)

# The engine (threads, deferral, callbacks, timeouts) at one to four ranks (two per core on the
# 2-core CI machine); the algorithm oracles through the engine at every size (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3, 4)

SMALL = collectives.Options(segment_bytes=256, node_size=2)  # several segments, fewer messages
WAIT_S = 120  # no single wait in these tests may hang the suite


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


@pytest.mark.world_sizes()  # every size: the algorithms through the engine
@pytest.mark.parametrize("algorithm", list(collectives.ALGORITHMS))
def test_iallreduce_matches_reference_and_blocking(algorithm, comm):
    """Every allreduce algorithm through the engine: reference, identical everywhere, and the
    same bits as the blocking call; several requests in flight at once."""
    cases, requests = [], []
    opts = for_algorithm(SMALL, algorithm)
    for count in counts_for(comm.size):
        for dtype, op in ((np.dtype(np.float32), "sum"), (np.dtype(np.float16), "avg"),
                          (np.dtype(np.int64), "max"), (np.dtype(np.float64), "prod")):
            for inplace in (False, True):
                x = make_input(count, dtype, op, comm.rank)
                buf = x.copy()
                req = collectives.iallreduce(buf, out=buf if inplace else None, op=op,
                                             algorithm=algorithm, comm=comm, options=opts)
                cases.append((x, op, inplace, buf))
                requests.append(req)
    results = collectives.waitall(requests, timeout=WAIT_S)
    for (x, op, inplace, buf), y in zip(cases, results):
        what = f"i{algorithm} p={comm.size} n={x.size} {x.dtype} {op} inplace={inplace}"
        assert (y is buf) == inplace, what
        blocking = collectives.allreduce(x, op=op, algorithm=algorithm, comm=comm, options=opts)
        assert _same_bits(y, blocking), f"{what}: differs from the blocking result"
        assert_close(y, x, op, comm, what, identical=True)


BLOCKS = [("reduce_scatter", a) for a in collectives.REDUCE_SCATTER] + \
    [("allgather", a) for a in collectives.ALLGATHER] + \
    [("bcast", a) for a in collectives.BCAST] + [("reduce", a) for a in collectives.REDUCE]


def _block_calls(name, x, algorithm, comm, root):
    """(non-blocking request, blocking result) of one block with the same arguments."""
    kw = dict(algorithm=algorithm, comm=comm, options=SMALL)
    if name == "reduce_scatter":
        return collectives.ireduce_scatter(x, op="sum", **kw), \
            collectives.reduce_scatter(x, op="sum", **kw)
    if name == "allgather":
        return collectives.iallgather(x, **kw), collectives.allgather(x, **kw)
    if name == "bcast":
        a, b = x.copy(), x.copy()
        return collectives.ibcast(a, root=root, **kw), collectives.bcast(b, root=root, **kw)
    return collectives.ireduce(x, op="sum", root=root, **kw), \
        collectives.reduce(x, op="sum", root=root, **kw)


def _block_reference(name, x, comm, root):
    """What the block must return on this rank, from a plain gather of every rank's input."""
    rows = gather_all(x, comm)
    if name == "allgather":
        return rows.reshape(-1)
    if name == "bcast":
        return rows[root]
    total = reference_allreduce(x, "sum", comm).astype(x.dtype)
    if name == "reduce":
        return total if comm.rank == root else None
    offsets = partition(x.size, comm.size)
    return total[offsets[comm.rank]:offsets[comm.rank + 1]]


@pytest.mark.world_sizes()  # every size: the algorithms through the engine
@pytest.mark.parametrize("name,algorithm", BLOCKS)
def test_blocks_nonblocking_equal_blocking(name, algorithm, comm):
    root = comm.size - 1
    for count in counts_for(comm.size):
        for dtype in (np.dtype(np.float64), np.dtype(np.uint16)):
            x = make_input(count, dtype, "sum", comm.rank)
            req, expected = _block_calls(name, x, algorithm, comm, root)
            got = req.wait(timeout=WAIT_S)
            reference = _block_reference(name, x, comm, root)
            what = f"i{name} {algorithm} p={comm.size} n={count} {dtype}"
            if expected is None:
                assert got is None and reference is None, what
                continue
            assert _same_bits(got, expected), f"{what}: differs from the blocking result"
            if dtype.kind == "f":  # sums of p standard normals: rounding only
                assert np.allclose(got, reference, rtol=1e-12, atol=1e-12), what
            else:
                assert np.array_equal(got, reference), what


def _routing_calls(x, count, algorithm, comm):
    """(label, non-blocking request, blocking result) of alltoall (equal blocks, in place and
    the v form), gather and scatter (equal blocks and v forms) and barrier on the same
    arguments, for the algorithm ``algorithm`` of each table that has it; ``x`` holds
    ``count`` elements per block (p blocks)."""
    p, rank, root = comm.size, comm.rank, comm.size - 1
    kw = dict(algorithm=algorithm, comm=comm, options=for_algorithm(SMALL, algorithm))
    v = [(count + 3 * rank + 5 * j) % (count + 1) for j in range(p)]  # this rank's send counts
    own = [(count + k) % (count + 1) for k in range(p)]  # gatherv/scatterv blocks
    mine = x[:own[rank]]
    calls = []
    if algorithm in collectives.ALLTOALL:
        calls.append(("alltoall", collectives.ialltoall(x, **kw), collectives.alltoall(x, **kw)))
        a, b = x.copy(), x.copy()
        calls.append(("alltoall in place", collectives.ialltoall(a, out=a, **kw),
                      collectives.alltoall(b, out=b, **kw)))
        if algorithm not in EQUAL_BLOCKS_ONLY:
            xv = x[:sum(v)]
            calls.append(("alltoall counts", collectives.ialltoall(xv, counts=v, **kw),
                          collectives.alltoall(xv, counts=v, **kw)))
    if algorithm in collectives.GATHER:
        for counts, y in ((None, x[:count]), (own, mine)):
            calls.append((f"gather counts={counts}",
                          collectives.igather(y, root=root, counts=counts, **kw),
                          collectives.gather(y, root=root, counts=counts, **kw)))
    if algorithm in collectives.SCATTER:
        for counts, n in ((None, count), (own, own[rank])):
            src = x[:p * count if counts is None else sum(own)] if rank == root else None
            calls.append((f"scatter counts={counts}",
                          collectives.iscatter(src, out=np.empty(n, x.dtype), root=root,
                                               counts=counts, **kw),
                          collectives.scatter(src, out=np.empty(n, x.dtype), root=root,
                                              counts=counts, **kw)))
    if algorithm in collectives.BARRIER:
        calls.append(("barrier", collectives.ibarrier(**kw), collectives.barrier(**kw)))
    return calls


ROUTING = sorted(set(collectives.ALLTOALL) | set(collectives.GATHER) | set(collectives.SCATTER)
                 | set(collectives.BARRIER))


@pytest.mark.parametrize("algorithm", ROUTING)
def test_alltoall_gather_scatter_barrier_nonblocking_equal_blocking(algorithm, comm):
    """ialltoall (equal blocks, in place, counts=), igather, iscatter (with and without counts)
    and ibarrier: the same bits as the blocking call at counts 0, 1, p+1 and 1001, each request
    waited after its blocking twin has run (so several are in flight on the engine)."""
    for count in (0, 1, comm.size + 1, 1001):
        for dtype in (np.dtype(np.float32), np.dtype(np.int64)):
            x = make_input(count * comm.size, dtype, "sum", comm.rank)
            for label, req, expected in _routing_calls(x, count, algorithm, comm):
                got = req.wait(timeout=WAIT_S)
                what = f"i{label} {algorithm} p={comm.size} n={count} {dtype}"
                if label.startswith("alltoall counts"):
                    (got, got_counts), (expected, expected_counts) = got, expected
                    assert got_counts == expected_counts, what
                if expected is None:
                    assert got is None, what
                else:
                    assert _same_bits(got, expected), f"{what}: differs from the blocking result"


def test_new_forms_in_flight_together_waited_in_reverse_order(comm):
    """ialltoall (equal, in place, named v form), ibarrier, iallreduce, igather and iscatter
    started back to back on the engine, then waited last first."""
    p, rank = comm.size, comm.rank
    x = make_input(6 * p, np.dtype(np.float64), "sum", rank)
    a = x.copy()
    v = [rank + j for j in range(p)]
    root = p // 2
    starts = [
        lambda: collectives.ialltoall(x, comm=comm),
        lambda: collectives.ibarrier(comm=comm),
        lambda: collectives.iallreduce(x, comm=comm),
        lambda: collectives.ialltoall(a, out=a, algorithm="bruck", comm=comm),
        lambda: collectives.igather(x, root=root, comm=comm),
        lambda: collectives.iscatter(x if rank == root else None, out=np.empty(6), root=root,
                                     comm=comm),
        lambda: collectives.ialltoall(x[:sum(v)], counts=v, comm=comm, name="a2a.v"),
    ]
    requests = [start() for start in starts]
    results = [r.wait(timeout=WAIT_S) for r in reversed(requests)][::-1]
    expected = [collectives.alltoall(x, comm=comm), None, collectives.allreduce(x, comm=comm),
                collectives.alltoall(x.copy(), algorithm="bruck", comm=comm),
                collectives.gather(x, root=root, comm=comm),
                collectives.scatter(x if rank == root else None, out=np.empty(6), root=root,
                                    comm=comm),
                collectives.alltoall(x[:sum(v)], counts=v, comm=comm)]
    assert results[3] is a
    for k, (got, want) in enumerate(zip(results, expected)):
        if k == 6:
            assert got[1] == want[1], "ialltoall counts: out_counts"
            got, want = got[0], want[0]
        if want is None:
            assert got is None, f"#{k}"
        else:
            assert _same_bits(got, want), f"#{k}: differs from the blocking result"


def test_new_forms_argument_errors_raise_on_every_rank():
    """An argument error of ialltoall, ibarrier, igather or iscatter raises at the call on every
    rank that has it; one rank's error with validate=True is raised by wait() on every rank;
    the communicator then still works."""
    p, rank, last = MPI.COMM_WORLD.size, MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size - 1
    x = np.ones(2 * p)
    for start in (lambda: collectives.ialltoall(x, algorithm="bogus"),
                  lambda: collectives.ibarrier(algorithm="bogus"),
                  lambda: collectives.igather(x, algorithm="bogus"),
                  lambda: collectives.iscatter(x, algorithm="bogus")):
        with pytest.raises(ValueError, match="unknown algorithm 'bogus'"):
            start()
    if p > 1:  # the last rank alone is wrong: validate=True raises the same on every rank
        bad = rank == last
        for start in (lambda: collectives.ialltoall(np.ones(2 * p + bad), validate=True),
                      lambda: collectives.igather(x, root=p if bad else 0, validate=True),
                      lambda: collectives.iscatter(None if bad else x, validate=True)):
            req = start()
            with pytest.raises(ValueError, match=f"invalid arguments on rank {last}"):
                req.wait(timeout=WAIT_S)
    collectives.ibarrier().wait(timeout=WAIT_S)  # still in step


@pytest.mark.parametrize("codec,strategy", [("none", "summable"), ("fp16", "summable"),
                                            ("topk", "sparse"), ("topk", "allgather"),
                                            ("efsignsgd", "two_phase"), ("qsgd", "allgather")])
def test_icompressed_allreduce_equals_blocking(codec, strategy, comm):
    for n in (0, 1, comm.size + 1, 1001):
        x = np.random.default_rng([comm.rank, n]).standard_normal(n).astype(np.float32)
        made = [compress.get(codec, **({"seed": 5 + comm.rank} if codec == "qsgd" else {}))
                for _ in range(2)]
        req = collectives.icompressed_allreduce(x, made[0], strategy=strategy, key=f"k{n}",
                                                comm=comm)
        y = req.wait(timeout=WAIT_S)
        z = collectives.compressed_allreduce(x, made[1], strategy=strategy, key=f"b{n}", comm=comm)
        what = f"{codec} {strategy} p={comm.size} n={n}"
        assert _same_bits(y, z), what
        assert_identical_everywhere(y, comm, what)


def test_many_outstanding_requests_in_random_order():
    """72 requests of mixed algorithms, sizes, dtypes and three communicators, in flight at
    once, waited in an order that differs from rank to rank."""
    world = MPI.COMM_WORLD
    comms = [world, world.Split(world.rank % 2, world.rank), world.Dup()]
    rng = np.random.default_rng(42)  # the same plan on every rank
    algorithms = list(collectives.ALGORITHMS)
    plan = []
    for i in range(72):
        comm = comms[i % 3]
        n = int(rng.choice([0, 1, 7, 333, 4099, 20001]))
        dtype = np.dtype(rng.choice(["float32", "float64", "int32", "float16"]))
        plan.append((comm, n, dtype, algorithms[int(rng.integers(len(algorithms)))]))
    requests, inputs = [], []
    for comm, n, dtype, algorithm in plan:
        x = make_input(n, dtype, "sum", comm.rank, seed=n)
        inputs.append(x)
        requests.append(collectives.iallreduce(x, algorithm=algorithm, comm=comm,
                                               options=for_algorithm(SMALL, algorithm)))
    order = np.random.default_rng(world.rank).permutation(len(requests))
    results = {}
    for k in order:
        results[k] = requests[k].wait(timeout=WAIT_S)
    for k, (comm, n, dtype, algorithm) in enumerate(plan):
        assert_close(results[k], inputs[k], "sum", comm, f"#{k} {algorithm} n={n} {dtype}")
    for comm in comms[1:]:
        comm.Free()


def test_waitany_and_test_loops(comm):
    xs = [make_input(n, np.dtype(np.float64), "sum", comm.rank) for n in (5, 500, 50000, 17)]
    requests = [collectives.iallreduce(x, algorithm=a, comm=comm)
                for x, a in zip(xs, ["ring", "tree", "rabenseifner", "native"])]
    left = list(range(len(requests)))
    while left:  # waitany until every request is done
        i, y = collectives.waitany([requests[k] for k in left], timeout=WAIT_S)
        k = left.pop(i)
        assert_close(y, xs[k], "sum", comm, f"waitany #{k}")
    requests = [collectives.iallreduce(x, comm=comm) for x in xs]
    deadline = time.monotonic() + WAIT_S
    while not collectives.testall(requests):  # a test() loop, as a training loop would poll
        assert time.monotonic() < deadline, "test() loop never finished"
        time.sleep(1e-4)
    assert all(r.test() for r in requests)
    for r, x in zip(requests, xs):
        assert_close(r.wait(), x, "sum", comm, "test loop")
    with pytest.raises(ValueError, match="at least one"):
        collectives.waitany([])


@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_doubling", "shm"])
def test_persistent_plan_started_1000_times(algorithm, comm):
    """1000 runs of one plan ("auto": native here, on the caller's thread), 100 for the
    hand-written algorithms (shm keeps its window between starts); new data every run, mixing
    plan() and start()/wait()."""
    x = np.empty(33, dtype=np.float64)
    out = np.empty_like(x)
    opts = for_algorithm(SMALL, algorithm)
    plan = collectives.allreduce_init(x, out=out, algorithm=algorithm, comm=comm, options=opts)
    runs = 1000 if algorithm == "auto" else 100
    p, r = comm.size, comm.rank
    for i in range(runs):
        x[:] = np.arange(33) * (i + 1) + r  # new data every time, in the same buffer
        if i % 3 == 2:
            assert plan.start() is plan
            y = plan.wait(timeout=WAIT_S)
        else:
            y = plan()
        assert y is out
        expected = np.arange(33) * (i + 1) * p + p * (p - 1) / 2
        assert np.array_equal(y, expected), f"run {i}"
    blocking = collectives.allreduce(x, algorithm=algorithm, comm=comm, options=opts)
    assert _same_bits(out, blocking)
    with pytest.raises(RuntimeError, match="still running"):
        plan.start()
        plan.start()
    plan.wait(timeout=WAIT_S)


def test_requests_progress_while_the_caller_sleeps():
    """A real overlap test: submitted, then the caller sleeps without ever calling test() or
    wait(); the requests complete during the sleep."""
    comm = MPI.COMM_WORLD
    xs = [make_input(n, np.dtype(np.float32), "sum", comm.rank) for n in (1 << 16, 1 << 18)]
    comm.Barrier()
    requests = [collectives.iallreduce(x, algorithm=a) for x, a in zip(xs, ["ring", "native"])]
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline and not all(r._done for r in requests):
        time.sleep(0.05)  # no test(), no wait(): only the engine makes progress
    woke = time.perf_counter()
    assert all(r._done for r in requests), "the engine made no progress while the caller slept"
    assert all(r.finished < woke for r in requests)
    for r, x in zip(requests, xs):
        assert_close(r.wait(), x, "sum", comm, "overlap")


def _boom_algorithm(src, buf, op, ctx, opts):
    """An allreduce that fails on rank 0 before sending anything (others do nothing)."""
    if ctx.comm.rank == 0:
        raise ZeroDivisionError("injected failure")


def test_exception_surfaces_at_that_ranks_wait():
    world = MPI.COMM_WORLD
    comm = world.Dup()
    collectives.ALGORITHMS["_boom"] = _boom_algorithm
    try:
        req = collectives.iallreduce(np.ones(8), algorithm="_boom", comm=comm)
        if comm.size > 1 and comm.rank == 0:
            with pytest.raises(ZeroDivisionError, match="injected failure") as info:
                req.wait(timeout=WAIT_S)
            frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
            assert "_boom_algorithm" in frames, frames  # the original traceback
            # the ranks may now be out of step: this engine refuses further operations
            with pytest.raises(collectives.EngineError, match="injected failure"):
                collectives.iallreduce(np.ones(8), comm=comm).wait(timeout=WAIT_S)
        else:
            req.wait(timeout=WAIT_S)
    finally:
        del collectives.ALGORITHMS["_boom"]
    world.Barrier()
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_skipped_operation_times_out_and_names_the_rank():
    world = MPI.COMM_WORLD
    comm = world.Dup()
    collectives.iallreduce(np.ones(4), comm=comm).wait(timeout=WAIT_S)  # engines exist
    opts = collectives.Options(timeout=0.5, stall_warning=0.2)
    x = np.full(4, float(comm.rank))
    if comm.rank != 0:
        req = collectives.iallreduce(x, algorithm="ring", comm=comm, options=opts)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(TimeoutError) as info:
                req.wait()
        message = str(info.value)
        assert "timed out after 0.5 s waiting for iallreduce #1 (" in message, message
        assert "rank(s) 0 have not submitted it" in message, message
        stalls = [w for w in caught if issubclass(w.category, collectives.StallWarning)]
        assert stalls and "rank(s) 0 have not submitted it" in str(stalls[0].message)
    world.Barrier()  # the others have timed out; now rank 0 arrives, late
    if comm.rank == 0:
        req = collectives.iallreduce(x, algorithm="ring", comm=comm, options=opts)
    y = req.wait(timeout=WAIT_S)  # the request survived its timeout
    assert np.array_equal(y, np.full(4, comm.size * (comm.size - 1) / 2))
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_validate_catches_mismatched_order_on_every_rank():
    world = MPI.COMM_WORLD
    comm = world.Dup()
    x = np.ones(6)
    first = [lambda: collectives.iallreduce(x, comm=comm, validate=True),
             lambda: collectives.ibcast(x.copy(), comm=comm, validate=True)]
    order = first if comm.rank == 0 else first[::-1]
    requests = [make() for make in order]
    messages = []
    for req in requests:
        with pytest.raises(ValueError) as info:
            req.wait(timeout=WAIT_S)
        messages.append(str(info.value))
    assert "the ranks submitted different operations" in messages[0], messages[0]
    assert "rank 0: iallreduce, rank 1: ibcast" in messages[0], messages[0]
    everyone = world.allgather(messages)
    assert all(m == everyone[0] for m in everyone), "ranks raised different errors"
    # a mismatch found by validation leaves the ranks in step: the engine keeps working
    y = collectives.iallreduce(x, comm=comm, validate=True).wait(timeout=WAIT_S)
    assert np.array_equal(y, x * comm.size)
    comm.Free()


@pytest.mark.parametrize("field", ["count", "dtype", "op"])
def test_validate_catches_mismatched_arguments(field):
    comm = MPI.COMM_WORLD
    r = comm.rank
    x = {"count": np.ones(4 + (r == 0)), "dtype": np.ones(4, np.float32 if r == 0 else np.float64),
         "op": np.ones(4)}[field]
    req = collectives.iallreduce(x, op="max" if field == "op" and r == 0 else "sum",
                                 validate=True)
    if comm.size == 1:
        req.wait()
        return
    with pytest.raises(ValueError, match=f"arguments differ across ranks \\({field}: rank 0:"):
        req.wait(timeout=WAIT_S)


def test_bad_arguments_raise_at_the_call_or_from_wait_with_validate():
    comm = MPI.COMM_WORLD
    with pytest.raises(ValueError, match="unknown algorithm"):
        collectives.iallreduce(np.ones(4), algorithm="bogus")
    with pytest.raises(TypeError, match="intracommunicator"):
        collectives.iallreduce(np.ones(4), comm="world")
    bad = "bogus" if comm.rank == comm.size - 1 else "ring"
    if comm.size == 1:
        with pytest.raises(ValueError, match="unknown algorithm"):
            collectives.iallreduce(np.ones(4), algorithm=bad, validate=True)
        return
    req = collectives.iallreduce(np.ones(4), algorithm=bad, validate=True)
    with pytest.raises(ValueError, match=f"invalid arguments on rank {comm.size - 1}: unknown "
                                         "algorithm 'bogus'"):
        req.wait(timeout=WAIT_S)


def test_submission_from_several_threads_in_a_fixed_order():
    """Requests are thread-safe to submit: two threads take turns (fixed by a lock-step), the
    engine runs them in submission order."""
    comm = MPI.COMM_WORLD
    xs = [make_input(100 + k, np.dtype(np.float64), "sum", comm.rank) for k in range(20)]
    requests = [None] * len(xs)
    turn = threading.Condition()
    state = {"next": 0}

    def worker(parity):
        for k in range(parity, len(xs), 2):
            with turn:
                turn.wait_for(lambda: state["next"] == k)
                requests[k] = collectives.iallreduce(xs[k], algorithm="ring")
                state["next"] += 1
                turn.notify_all()

    threads = [threading.Thread(target=worker, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    for req, x in zip(requests, xs):
        assert_close(req.wait(timeout=WAIT_S), x, "sum", comm, "threads")


def test_soak_leaves_no_threads_requests_or_engines():
    """A short soak of random non-blocking operations on a fresh communicator (the long one,
    with memory, is bench/soak_nonblocking.py); afterwards nothing is left behind."""
    world = MPI.COMM_WORLD
    threads_before = threading.active_count()
    engines_before = len(live_engines())
    comm = world.Dup()
    rng = np.random.default_rng(7)
    outstanding = []
    kinds = ["allreduce", "reduce_scatter", "allgather", "bcast", "reduce"]
    for i in range(300):
        kind = kinds[int(rng.integers(len(kinds)))]
        n = int(rng.integers(0, 300)) * comm.size
        x = np.full(n, 1.0 + comm.rank, dtype=np.float32)
        if kind == "allreduce":
            req = collectives.iallreduce(x, comm=comm, algorithm=str(rng.choice(
                ["ring", "native", "recursive_doubling"])))
        elif kind == "reduce_scatter":
            req = collectives.ireduce_scatter(x, comm=comm)
        elif kind == "allgather":
            req = collectives.iallgather(x, comm=comm)
        elif kind == "bcast":
            req = collectives.ibcast(x, comm=comm)
        else:
            req = collectives.ireduce(x, comm=comm)
        outstanding.append(req)
        if len(outstanding) > 16 or rng.random() < 0.2:
            rng.shuffle(outstanding)
            collectives.waitall(outstanding[:8], timeout=WAIT_S)
            del outstanding[:8]
    collectives.waitall(outstanding, timeout=WAIT_S)
    engine = collectives._runtime.comm_state.get(comm, "engine")
    if engine is not None:
        assert engine.outstanding() == [] and engine.pending == 0
        assert engine.submitted == engine.completed
    comm.Free()
    assert len(live_engines()) == engines_before
    deadline = time.monotonic() + 10
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == threads_before, threading.enumerate()


def test_named_operations_in_different_orders_agree_on_one(comm):
    """name=: each rank submits the same named operations in its own random order; the engines
    negotiate one order, and every result is right and equal to the blocking one."""
    r = comm.rank
    plan = [("allreduce", 1001, "ring"), ("allreduce", 7, "native"), ("bcast", 100, "binomial"),
            ("allgather", 33, "ring"), ("reduce_scatter", 64, "ring"),
            ("allreduce", 4099, "rabenseifner"), ("reduce", 9, "binomial")]
    inputs = [make_input(n, np.dtype(np.float64), "sum", r, seed=k)
              for k, (_, n, _) in enumerate(plan)]
    start = {"allreduce": collectives.iallreduce, "bcast": collectives.ibcast,
             "allgather": collectives.iallgather, "reduce_scatter": collectives.ireduce_scatter,
             "reduce": collectives.ireduce}
    block = {"allreduce": collectives.allreduce, "bcast": collectives.bcast,
             "allgather": collectives.allgather, "reduce_scatter": collectives.reduce_scatter,
             "reduce": collectives.reduce}
    requests = {}
    for k in np.random.default_rng([7, r]).permutation(len(plan)):
        kind, n, algorithm = plan[k]
        x = inputs[k].copy() if kind == "bcast" else inputs[k]
        requests[k] = start[kind](x, algorithm=algorithm, comm=comm, name=f"op{k}")
    if comm.size > 1:  # names are unique while in flight (on one rank each completes at once)
        held = np.ones(3)  # pending on rank 0 for sure: the others submit it after the barrier
        if r == 0:
            request = collectives.iallreduce(held, comm=comm, name="held")
            with pytest.raises(ValueError, match="already pending"):
                collectives.iallreduce(held, comm=comm, name="held")
        comm.Barrier()
        if r != 0:
            request = collectives.iallreduce(held, comm=comm, name="held")
        assert np.array_equal(request.wait(timeout=WAIT_S), held * comm.size)
    results = {k: requests[k].wait(timeout=WAIT_S)
               for k in np.random.default_rng([8, r]).permutation(len(plan))}
    for k, (kind, n, algorithm) in enumerate(plan):  # blocking calls: the same order everywhere
        got = results[k]
        x = inputs[k].copy() if kind == "bcast" else inputs[k]
        expected = block[kind](x, algorithm=algorithm, comm=comm)
        assert (got is None) == (expected is None), kind
        if got is not None:
            assert _same_bits(got, expected), f"{kind} op{k} differs from the blocking result"


@pytest.mark.mpi(min_size=2)
def test_named_mismatch_and_late_rank():
    comm = MPI.COMM_WORLD
    r = comm.rank
    with pytest.raises(ValueError) as info:
        collectives.iallreduce(np.ones(3 + (r == 0)), name="bad").wait(timeout=WAIT_S)
    assert "iallreduce 'bad': arguments differ across ranks (count: rank 0: 4, rank 1: 3" \
        in str(info.value)
    everyone = comm.allgather(str(info.value))
    assert all(m == everyone[0] for m in everyone)
    opts = collectives.Options(timeout=0.5)
    if r != 0:
        req = collectives.iallreduce(np.ones(2), name="late", options=opts)
        with pytest.raises(TimeoutError, match="'late'.*rank\\(s\\) 0 have not submitted it"):
            req.wait()
    comm.Barrier()
    if r == 0:
        req = collectives.iallreduce(np.ones(2), name="late", options=opts)
    assert np.array_equal(req.wait(timeout=WAIT_S), np.full(2, comm.size))


# ---------------------------------------------------------------------- completion callbacks

def _recorder():
    """A completion callback that records (request, thread name) and sets an event."""
    calls, called = [], threading.Event()

    def fn(request):
        calls.append((request, threading.current_thread().name))
        called.set()

    return fn, calls, called


def _pending_on_rank_0(comm, submit):
    """``submit()`` on rank 0 first, on the others only after a barrier, so rank 0's request is
    still pending when rank 0 gets it back (the engines exist already, or the first call would
    wait for every rank's first one). Returns (request, whether it was pending, then a hook to
    call once rank 0 has registered its callbacks, which lets the others submit)."""
    collectives.iallreduce(np.ones(2), comm=comm).wait(timeout=WAIT_S)  # engines exist
    request = submit() if comm.rank == 0 else None
    pending = request is not None and not request.test()

    def release():
        comm.Barrier()
        return request if comm.rank == 0 else submit()

    return request, pending, release


def test_callback_after_completion_runs_at_once(comm):
    x = np.full(5, float(comm.rank + 1))
    req = collectives.iallreduce(x, comm=comm)
    y = req.wait(timeout=WAIT_S)
    fn, calls, _ = _recorder()
    req.add_done_callback(fn)
    assert calls == [(req, threading.current_thread().name)]  # at once, on this thread
    assert req.wait() is y and np.array_equal(y, np.full(5, comm.size * (comm.size + 1) / 2))


@pytest.mark.parametrize("named", [False, True], ids=["ordered", "named"])
def test_callback_before_completion_runs_once_on_the_engine_thread(named, comm):
    """Added while the request is pending, callbacks run once each, in order, with the request,
    on the engine's thread (the named stream's for name=), after which wait() returns at once."""
    x = np.full(7, float(comm.rank + 1))
    name = "cb" if named else None
    submit = lambda: collectives.iallreduce(x, comm=comm, name=name)  # noqa: E731
    request, pending, release = _pending_on_rank_0(comm, submit)
    fn, calls, called = _recorder()
    second = []
    if comm.rank == 0:
        request.add_done_callback(fn)
        request.add_done_callback(lambda r: second.append(len(calls)))
    request = release()
    if comm.rank != 0:
        request.add_done_callback(fn)  # pending or done, whichever came first
        request.add_done_callback(lambda r: second.append(len(calls)))
    assert called.wait(WAIT_S), "the callback never ran"
    y = request.wait(timeout=WAIT_S)
    assert np.array_equal(y, np.full(7, comm.size * (comm.size + 1) / 2))
    collectives.iallreduce(x.copy(), comm=comm, name=name).wait(timeout=WAIT_S)  # and more
    assert len(calls) == 1 and calls[0][0] is request and second == [1], (calls, second)
    if comm.size == 1:  # completed during the call: at once, on this thread
        assert calls[0][1] == threading.current_thread().name
    elif comm.rank == 0:
        assert pending, "rank 0's request completed before the other ranks submitted it"
        thread = "collectives-named" if named else "collectives-engine"
        assert calls[0][1].startswith(thread), calls[0][1]


def test_callback_of_a_failed_operation():
    """A bad argument on one rank with validate=True: every rank's callback runs once, sees the
    request done, and wait() raises the same error as without a callback, in and after it."""
    comm = MPI.COMM_WORLD
    if comm.size == 1:  # validate on one process raises at the call
        return
    bad = "bogus" if comm.rank == comm.size - 1 else "ring"
    submit = lambda: collectives.iallreduce(np.ones(4), algorithm=bad, comm=comm,  # noqa: E731
                                            validate=True)
    request, _, release = _pending_on_rank_0(comm, submit)
    seen, called = [], threading.Event()

    def fn(r):
        seen.append(r.test())
        try:
            r.wait()
        except ValueError as exc:
            seen.append(str(exc))
        called.set()

    if comm.rank == 0:
        request.add_done_callback(fn)
    request = release()
    if comm.rank != 0:
        request.add_done_callback(fn)
    assert called.wait(WAIT_S), "the callback of the failed operation never ran"
    expected = f"invalid arguments on rank {comm.size - 1}: unknown algorithm 'bogus'"
    with pytest.raises(ValueError, match=expected):
        request.wait(timeout=WAIT_S)
    assert seen[0] is True and expected in seen[1] and len(seen) == 2, seen
    # a validation error leaves the ranks in step: the engine goes on
    y = collectives.iallreduce(np.ones(4), comm=comm).wait(timeout=WAIT_S)
    assert np.array_equal(y, np.full(4, comm.size))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_exception_in_a_callback_is_logged_and_the_engine_goes_on(comm):
    """A callback that raises on the engine's thread: logged with its traceback, the callbacks
    after it still run, and later operations (and their callbacks) complete."""
    handler = _Records()
    log = logging.getLogger("collectives.engine.requests")
    log.addHandler(handler)
    try:
        x = np.full(3, float(comm.rank))
        submit = lambda: collectives.iallreduce(x, comm=comm)  # noqa: E731
        request, _, release = _pending_on_rank_0(comm, submit)

        def boom(r):
            raise KeyError("callback bug")

        fn, calls, called = _recorder()
        if comm.rank == 0:
            request.add_done_callback(boom)
            request.add_done_callback(fn)
        request = release()
        if comm.rank != 0:
            request.add_done_callback(boom)
            request.add_done_callback(fn)
        assert called.wait(WAIT_S), "the callback after the failing one never ran"
        expected = np.full(3, comm.size * (comm.size - 1) / 2)
        assert np.array_equal(request.wait(timeout=WAIT_S), expected)
        for _ in range(3):  # later operations, with callbacks of their own
            later = collectives.iallreduce(x, comm=comm)
            later.add_done_callback(boom)
            later.add_done_callback(fn)
            assert np.array_equal(later.wait(timeout=WAIT_S), expected)
        deadline = time.monotonic() + WAIT_S
        while len(calls) < 4 and time.monotonic() < deadline:
            time.sleep(1e-3)  # wait() is woken before the callbacks run
        assert len(calls) == 4, calls
    finally:
        log.removeHandler(handler)
    assert len(handler.records) == 4, handler.records
    first = handler.records[0]
    assert first.getMessage().startswith("exception calling callback for <collectives.Request")
    assert first.exc_info[0] is KeyError and "callback bug" in str(first.exc_info[1])


def test_plan_callbacks_fire_once_per_run(comm):
    """A persistent plan: a callback added after start() fires once, when that run completes;
    one added while no run is under way runs at once."""
    x = np.empty(4)
    plan = collectives.allreduce_init(x, out=np.empty(4), comm=comm)
    fn, calls, _ = _recorder()
    for i in range(3):
        x[:] = i + comm.rank
        plan.start()
        plan.add_done_callback(fn)
        y = plan.wait(timeout=WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while len(calls) < i + 1 and time.monotonic() < deadline:
            time.sleep(1e-3)
        assert len(calls) == i + 1, (i, calls)
        assert np.array_equal(y, np.full(4, comm.size * i + comm.size * (comm.size - 1) / 2))
    plan.add_done_callback(fn)  # no run under way: at once
    assert len(calls) == 4 and calls[-1] == (plan, threading.current_thread().name)


@pytest.mark.parametrize("algorithm", ["ring", "native", "auto"])
def test_device_arrays_through_the_engine(algorithm, backend):
    """CuPy arrays (skipped without a GPU): the stream is synchronised at submission, the result
    is a device array bitwise equal to the blocking call's; a plan runs on them too."""
    to_device, to_host = backend
    comm = MPI.COMM_WORLD
    x = make_input(1001, np.dtype(np.float32), "sum", comm.rank)
    d = to_device(x.copy())
    y = collectives.iallreduce(d, algorithm=algorithm).wait(timeout=WAIT_S)
    assert type(y) is type(d)
    blocking = collectives.allreduce(to_device(x.copy()), algorithm=algorithm)
    assert _same_bits(to_host(y), to_host(blocking))
    assert_close(to_host(y), x, "sum", comm, f"device {algorithm}")
    plan = collectives.allreduce_init(d, algorithm=algorithm)
    for _ in range(3):
        assert _same_bits(to_host(plan()), to_host(blocking))


# -- small operations: run by their own wait() on the caller's thread (engine/engine.py) --------
@pytest.fixture
def quiet_engine(monkeypatch):
    """A communicator whose engine exists and whose thread does not wake by itself meanwhile
    (its idle poll, which starts a deferred operation nobody asked for, set to 30 s)."""
    world = MPI.COMM_WORLD
    comm = world.Dup()
    collectives.iallreduce(np.ones(4), comm=comm).wait(timeout=WAIT_S)  # the engine exists
    monkeypatch.setattr(engine_module, "IDLE_POLL_S", 30.0)
    time.sleep(0.1)  # past the thread's current idle poll: it now sleeps until work arrives
    yield comm
    comm.Free()


def _threads_that_run(engine):
    """Record the thread each of ``engine``'s operations runs on (a list, in run order)."""
    ran, execute = [], engine._execute

    def recording(request):
        ran.append((request.seq, threading.current_thread().name))
        return execute(request)

    engine._execute = recording
    return ran


@pytest.mark.parametrize("count_of, small", [(lambda p: 1, True), (lambda p: p + 1, True),
                                             (lambda p: 1024, True), (lambda p: 1025, False),
                                             (lambda p: 40_001, False)])
@pytest.mark.mpi(min_size=2)
def test_a_small_operation_on_an_idle_engine_is_run_by_its_wait(count_of, small, quiet_engine):
    """At most INLINE_BYTES (4 KiB), submitted to an idle engine: deferred, then run by wait()
    on the caller's thread; larger: the engine's thread. Results against the reference, every
    rank the same bits, plans too."""
    comm = quiet_engine
    engine = engine_of(comm)
    ran = _threads_that_run(engine)
    x = make_input(count_of(comm.size), np.dtype(np.float32), "sum", comm.rank)
    req = collectives.iallreduce(x, comm=comm)
    assert (engine._deferred is req) == small
    y = req.wait()
    assert_close(y, x, "sum", comm, f"n={x.size}", identical=True)
    plan = collectives.allreduce_init(x, comm=comm)
    z = plan.start().wait()
    assert _same_bits(z, y)
    here = threading.current_thread().name
    assert [name == here for _, name in ran] == [small, small], ran
    del engine._execute
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_a_deferred_operation_nobody_waits_for_still_completes():
    """The engine's thread starts a deferred operation by itself at its next idle poll: a rank
    that never calls wait() or test() still lets the others finish theirs."""
    world = MPI.COMM_WORLD
    comm = world.Dup()
    collectives.iallreduce(np.ones(4), comm=comm).wait(timeout=WAIT_S)
    x = np.full(3, float(comm.rank + 1))
    req = collectives.iallreduce(x, comm=comm)
    end = time.monotonic() + 10 * engine_module.IDLE_POLL_S + 5
    while not req._done and time.monotonic() < end:  # no wait(), no test(): nothing kicks it
        time.sleep(0.01)
    assert req._done
    assert np.array_equal(req.wait(), np.full(3, comm.size * (comm.size + 1) / 2))
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_what_hands_a_deferred_operation_to_the_engine_thread(quiet_engine):
    """test(), a callback, a wait with a time limit, waitall and the next submission give a
    deferred operation to the engine's thread, in submission order; the results stay right."""
    comm = quiet_engine
    engine = engine_of(comm)
    ran = _threads_that_run(engine)
    here = threading.current_thread().name
    x = np.full(5, float(comm.rank))
    want = np.full(5, comm.size * (comm.size - 1) / 2)
    kicks = {
        "test": lambda r: r.test(),
        "testall": lambda r: collectives.testall([r]),
        "callback": lambda r: r.add_done_callback(lambda _: None),
        "timeout": lambda r: r.wait(timeout=WAIT_S),
        "waitall": lambda r: collectives.waitall([r]),
    }
    for name, kick in kicks.items():
        ran.clear()
        req = collectives.iallreduce(x, comm=comm)
        assert engine._deferred is req
        kick(req)
        end = time.monotonic() + 10  # the engine's idle poll is 30 s: only the kick starts it
        while not req._done and time.monotonic() < end:
            time.sleep(0.005)
        assert req._done, name
        assert np.array_equal(req.result, want), name
        assert [thread == here for _, thread in ran] == [False], (name, ran)
    ran.clear()
    first = collectives.iallreduce(x, comm=comm)
    second = collectives.iallreduce(np.arange(2000.0), comm=comm)  # 16 kB: never deferred
    assert engine._deferred is None
    collectives.waitall([second, first])
    assert [seq for seq, _ in ran] == [first.seq, second.seq]
    assert first.finished <= second.started
    assert np.array_equal(first.result, want)
    del engine._execute
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_a_small_operation_run_by_its_wait_warns_when_it_stalls():
    """The caller's thread gives the stall warning a wait would, while it runs the operation
    itself: the last rank submits late, the others warn naming it, and all finish."""
    world = MPI.COMM_WORLD
    comm = world.Dup()
    collectives.iallreduce(np.ones(4), comm=comm).wait(timeout=WAIT_S)
    late = comm.size - 1
    opts = collectives.Options(stall_warning=0.3)
    x = np.full(4, 1.0)
    if comm.rank == late:
        time.sleep(1.5)
    req = collectives.iallreduce(x, comm=comm, options=opts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", collectives.StallWarning)
        y = req.wait()
    assert np.array_equal(y, np.full(4, float(comm.size)))
    stalls = [str(w.message) for w in caught if issubclass(w.category, collectives.StallWarning)]
    if comm.rank != late:
        assert len(stalls) == 1 and f"rank(s) {late} have not submitted it" in stalls[0], stalls
    comm.Free()


def test_repeated_iallreduce_reuses_checks_safely(monkeypatch):
    """iallreduce(x, out=y) repeated with the same arrays submits the last call's checked call
    again (its remembered call, _runtime/repeats.py), with the blocking call's bits; what can
    change in place between calls is noticed: shape, dtype, write flag, options, a freed
    communicator."""
    from collectives.engine import nonblocking

    world = MPI.COMM_WORLD
    comm = world.Dup()
    p = comm.size
    x = make_input(1001, np.dtype(np.float64), "sum", comm.rank)
    y = np.empty_like(x)
    checked = []
    submit = nonblocking._submit
    monkeypatch.setattr(nonblocking, "_submit", lambda *a: checked.append(a[0]) or submit(*a))
    for algorithm in ("auto", "native", "ring"):
        once = collectives.allreduce(x, comm=comm, algorithm=algorithm)
        checked.clear()
        for _ in range(4):
            y[...] = 0
            assert collectives.iallreduce(x, out=y, comm=comm, algorithm=algorithm).wait() is y
            assert _same_bits(y, once), algorithm
        assert len(checked) == (1 if p > 1 else 4), algorithm  # one process: never remembered
    z = np.full(5, comm.rank + 1, dtype=np.int64)  # in place, repeated: each call sums again
    for k in range(3):
        assert collectives.iallreduce(z, out=z, comm=comm).wait() is z
        assert np.array_equal(z, np.full(5, p * (p + 1) // 2 * p ** k)), k
    x.shape = y.shape = (7, 143)  # reshaped in place: checked again, right shape out
    for _ in range(2):
        y[...] = 0
        assert collectives.iallreduce(x, out=y, comm=comm).wait().shape == (7, 143)
        assert_close(y, x, "sum", comm, "2-D repeat")
    x.shape = (1001,)
    with pytest.raises(ValueError, match="shape"):
        collectives.iallreduce(x, out=y, comm=comm)
    y.shape = (1001,)
    collectives.iallreduce(x, out=y, comm=comm).wait()
    y.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        collectives.iallreduce(x, out=y, comm=comm)
    y.flags.writeable = True
    collectives.iallreduce(x, out=y, comm=comm).wait()
    y.dtype = np.int64  # the same bytes seen as another dtype: checked again
    with pytest.raises(ValueError, match="dtype int64, expected float64"):
        collectives.iallreduce(x, out=y, comm=comm)
    y.dtype = np.float64
    checked.clear()
    for options in (collectives.Options(), collectives.Options(segment_bytes=4096)):
        for _ in range(3):  # new options: checked once, then remembered with them
            collectives.iallreduce(x, out=y, comm=comm, options=options).wait()
            assert_close(y, x, "sum", comm, "options")
    assert len(checked) == (2 if p > 1 else 6)
    comm.Free()
    with pytest.raises(TypeError, match="intracommunicator"):
        collectives.iallreduce(x, out=y, comm=comm)


def test_a_remembered_iallreduce_keeps_no_array_alive():
    """The repeat of iallreduce (_runtime/repeats.py) holds its arrays by weak references only: once
    the caller drops them (and the requests), they are freed; a new pair is checked afresh."""
    import gc
    import weakref

    world = MPI.COMM_WORLD
    comm = world.Dup()
    x = np.full(1000, comm.rank + 1.0)
    y = np.empty_like(x)
    for _ in range(3):
        collectives.iallreduce(x, out=y, comm=comm).wait()
    assert np.array_equal(y, np.full(1000, comm.size * (comm.size + 1) / 2))
    refs = weakref.ref(x), weakref.ref(y)
    del x, y
    gc.collect()
    assert refs[0]() is None and refs[1]() is None
    z = np.full(7, 2.0)
    assert np.array_equal(collectives.iallreduce(z, out=np.empty(7), comm=comm).wait(),
                          np.full(7, 2.0 * comm.size))
    comm.Free()
