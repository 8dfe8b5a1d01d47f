"""alltoall(v), gather(v), scatter(v) and barrier against gather-and-compute references.

Each test body loops over counts (0, 1, p-1, p+1 and a large odd one, :func:`counts_for`),
dtypes and roots inside one rank-run, so that a world size costs one launch; every result is
compared bitwise with what NumPy computes from every rank's input (``comm.allgather``).
"""

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from reference import COVERING_FROM, counts_for, make_input

try:
    import ml_dtypes

    BF16 = [np.dtype(ml_dtypes.bfloat16)]
except ImportError:  # bfloat16 is then not tested here
    BF16 = []

DTYPES = [np.dtype(d) for d in ("float32", "float64", "int64", "float16")] + BF16
#: the root sweeps take fewer dtypes: the trees move bytes, the dtype changes only their number
ROOT_DTYPES = [np.dtype(np.float16), np.dtype(np.int64)] + BF16


def _dtypes(p, k, dtypes=None):
    """The dtypes of case ``k``: all of them below :data:`COVERING_FROM` ranks, two in turn from
    there on (the blocks move bytes; more ranks than cores make every call slow)."""
    dtypes = DTYPES if dtypes is None else dtypes
    if p < COVERING_FROM:
        return dtypes
    return [dtypes[(2 * k) % len(dtypes)], dtypes[(2 * k + 1) % len(dtypes)]]


def _data(count, dtype, rank, seed=0):
    x = make_input(count, np.dtype(np.float32) if dtype in BF16 else dtype, "sum", rank, seed)
    return x.astype(dtype)


def _bits(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _uneven(total, p, seed):
    """Uneven counts summing to total, some zero (the same on every rank for the same seed)."""
    rng = np.random.default_rng([total, p, seed])
    cuts = np.sort(rng.integers(0, total + 1, p - 1))
    return np.diff(np.concatenate([[0], cuts, [total]])).astype(int).tolist()


@pytest.mark.parametrize("algorithm", list(collectives.ALLTOALL))
def test_alltoall(algorithm, comm):
    p, r = comm.size, comm.rank
    for k, block in enumerate(counts_for(p)):
        for j, dtype in enumerate(_dtypes(p, k)):
            x = _data(block * p, dtype, r, k)
            xs = comm.allgather(x)
            expected = np.concatenate([xs[i][r * block:(r + 1) * block] for i in range(p)])
            inplace = (k + j) % 2 == 1
            shaped = x.reshape(p, block)  # a 2-D array keeps its shape
            y = collectives.alltoall(shaped, out=shaped if inplace else None,
                                     algorithm=algorithm, comm=comm)
            what = f"{algorithm} block={block} {dtype} inplace={inplace}"
            assert y.shape == (p, block) and y.dtype == dtype, what
            assert (y is shaped) == inplace, what
            assert np.array_equal(_bits(y), _bits(expected)), what


@pytest.mark.parametrize("algorithm", [a for a in collectives.ALLTOALL
                                       if a not in collectives.algorithms.EQUAL_BLOCKS_ONLY])
def test_alltoallv(algorithm, comm):
    """Horovod's splits: each rank gives its send counts, learns its receive counts."""
    p, r = comm.size, comm.rank
    for k, total in enumerate(counts_for(p)):
        for dtype in _dtypes(p, k, DTYPES[::2] + DTYPES[3:4])[:2 if p < COVERING_FROM else 1]:
            sends = [_uneven(total + i, p, k) for i in range(p)]  # row i: rank i's counts
            x = _data(total + r, dtype, r, k)
            xs = comm.allgather(x)
            offs = [np.concatenate([[0], np.cumsum(row)]).astype(int) for row in sends]
            expected = np.concatenate([xs[i][offs[i][r]:offs[i][r + 1]] for i in range(p)])
            out = None
            if k % 2:  # a caller's out of the right size
                out = np.empty(sum(row[r] for row in sends), dtype)
            y, got = collectives.alltoall(x, out=out, counts=sends[r], algorithm=algorithm,
                                          comm=comm)
            what = f"{algorithm} total={total} {dtype} counts={sends[r]}"
            assert got == [row[r] for row in sends], what
            assert out is None or y is out, what
            assert y.shape == (sum(got),) and y.dtype == dtype, what
            assert np.array_equal(_bits(y), _bits(expected)), what


#: The shm alltoall's paths (``algorithms/shm_alltoall.py``), each with slots of 64 bytes (a
#: few bytes of every block a round: blocks longer than a slot go in many rounds): through the
#: slots, by cross-memory attach (where the team may), from an input in shared memory
#: (``collectives.empty``: read in place), and with the even ranks on the interpreted driver.
SHM_PATHS = {"slots": dict(shm_segment_bytes=1, shm_cma_bytes=1 << 62),
             "cma": dict(shm_segment_bytes=1, shm_cma_bytes=0),
             "shared": dict(shm_segment_bytes=1, shm_cma_bytes=1 << 62),
             "interpreted": dict(shm_segment_bytes=1, shm_cma_bytes=1 << 62)}


@pytest.mark.world_sizes(1, 2, 3, 4, 5, 7, 8)
@pytest.mark.parametrize("path", list(SHM_PATHS))
def test_shm_alltoall_paths(path, monkeypatch):
    """Each path of the shm alltoall against the gathered reference, bitwise, blocks of 0, 1,
    p+1 and 37 elements (up to 37 rounds), in place and not, a dtype per block size; a
    remembered repeat (the lane's compiled entry) with new contents each time."""
    from collectives._runtime.shmem import team

    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    opts = collectives.Options(**SHM_PATHS[path])
    if path == "interpreted":
        monkeypatch.setattr(team, "INTERPRET", r % 2 == 0)
    for k, block in enumerate([0, 1, p + 1, 37]):
        dtype = DTYPES[(k + len(path)) % len(DTYPES)]
        x = _data(block * p, dtype, r, k)
        if path == "shared":
            shared = collectives.empty(x.shape, dtype)
            shared[...] = x
            x = shared
        xs = comm.allgather(np.asarray(x))
        expected = np.concatenate([xs[i][r * block:(r + 1) * block] for i in range(p)])
        y = collectives.alltoall(x, algorithm="shm", options=opts)
        assert np.array_equal(_bits(y), _bits(expected)), (path, block, dtype)
        z = np.array(x)
        collectives.alltoall(z, out=z, algorithm="shm", options=opts)
        assert np.array_equal(_bits(z), _bits(expected)), (path, block, dtype, "in place")
    out = np.empty(5 * p, np.int64)
    x = np.empty(5 * p, np.int64)
    for step in range(3):  # the third one is the lane's entry where the kernel is compiled
        x[:] = np.arange(5 * p) + 100 * r + 1000 * step
        assert collectives.alltoall(x, out=out, algorithm="shm", options=opts) is out
        expected = np.concatenate([np.arange(5 * r, 5 * r + 5) + 100 * i + 1000 * step
                                   for i in range(p)])
        assert np.array_equal(out, expected), (path, step)


def _vcases(p):
    """Count matrices of the shm v form (row i: what rank i sends each rank), with a dtype
    each: uneven with zeros; rank 0 sending nothing; very unequal (one block many rounds long,
    the others 0 or 1 elements); all zero but one rank's own block."""
    rng = np.random.default_rng(p)
    uneven = rng.integers(0, 7, (p, p)) * rng.integers(0, 2, (p, p))
    silent = rng.integers(1, 5, (p, p))
    silent[0] = 0
    unequal = np.add.outer(np.arange(p), np.arange(p)) % 2
    unequal[p - 1, 0] = 50  # 400 bytes: 50 rounds of 8-byte segments at p = 8
    alone = np.zeros((p, p), int)
    alone[p // 2, p // 2] = 3
    return [(uneven, DTYPES[-1]), (silent, np.dtype(np.float32)),
            (unequal, np.dtype(np.float64)), (alone, np.dtype(np.int64))]


#: The v form's paths: the equal form's, and blocks of 16 bytes and more by cross-memory
#: attach with the shorter ones through the slots (``Options.shm_cma_bytes`` / p per block).
SHM_VPATHS = {**SHM_PATHS, "mixed": dict(shm_segment_bytes=1, shm_cma_bytes=0)}


@pytest.mark.world_sizes(1, 2, 3, 4, 5, 7, 8)
@pytest.mark.parametrize("path", list(SHM_VPATHS))
def test_shm_alltoallv_paths(path, monkeypatch):
    """The shm v form on each path against the gathered reference, bitwise: counts with zeros,
    a rank that sends nothing, one block of many rounds beside blocks of 0 and 1 element (on
    slots of 64 bytes: a few bytes of every block a round, the ranks' numbers of rounds
    differing), a caller's out."""
    from collectives._runtime.shmem import team

    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    settings = dict(SHM_VPATHS[path])
    if path == "mixed":
        settings["shm_cma_bytes"] = 16 * p
    opts = collectives.Options(**settings)
    if path == "interpreted":
        monkeypatch.setattr(team, "INTERPRET", r % 2 == 0)
    for k, (sends, dtype) in enumerate(_vcases(p)):
        x = _data(int(sends[r].sum()), dtype, r, k)
        if path == "shared":
            shared = collectives.empty(x.shape, dtype)
            shared[...] = x
            x = shared
        xs = comm.allgather(np.asarray(x))
        offs = [np.concatenate([[0], np.cumsum(row)]).astype(int) for row in sends]
        expected = np.concatenate([xs[i][offs[i][r]:offs[i][r + 1]] for i in range(p)])
        out = np.empty(int(sends[:, r].sum()), dtype) if k % 2 else None
        y, got = collectives.alltoall(x, out=out, counts=sends[r].tolist(), algorithm="shm",
                                      options=opts)
        what = (path, k, dtype)
        assert got == sends[:, r].tolist(), what
        assert out is None or y is out, what
        assert np.array_equal(_bits(y), _bits(expected)), what


@pytest.mark.world_sizes(2, 3)
def test_shm_alltoallv_counts_mismatch_raises_on_every_rank(monkeypatch):
    """Send and receive offsets whose counts disagree between two ranks (given to the
    algorithm itself: the public v form learns its receive counts), through the slots and by
    cross-memory attach: every rank raises the same ValueError, naming the pair, and no rank's
    output was written (the counts are compared before any data moves); so does a threshold of
    cross-memory attach that differs on one rank (how a block travels); a dtype that differs
    on one rank in the public v form raises on every rank too; the next calls are right."""
    from collectives._runtime.context import context
    from collectives.algorithms import shm_alltoall

    comm = MPI.COMM_WORLD
    p, r, last = comm.size, comm.rank, comm.size - 1
    ctx = context(comm)
    for settings in SHM_PATHS["slots"], SHM_PATHS["cma"]:
        opts = collectives.Options(**settings)
        counts = np.full(p, 2)
        recv = np.full(p, 2)
        if r == last:
            recv[0] = 3  # rank 0 sends 2
        x = np.arange(2 * p, dtype=np.float32)
        out = np.full(int(recv.sum()), -7.0, np.float32)
        sendoffsets = np.concatenate([[0], np.cumsum(counts)]).tolist()
        recvoffsets = np.concatenate([[0], np.cumsum(recv)]).tolist()
        error = _same_error_everywhere(
            lambda: shm_alltoall.alltoall(x, out, sendoffsets, recvoffsets, ctx, opts),
            ValueError)
        assert f"rank 0 sends 2 elements to rank {last}, which expects 3" in str(error)
        assert np.all(out == -7.0), settings
    # one rank would read by cross-memory attach the blocks another stages: found the same way
    real = shm_alltoall.block_cma_bytes
    monkeypatch.setattr(shm_alltoall, "block_cma_bytes",
                        lambda team, o: 0 if r == last else real(team, o))
    out = np.full(2 * p, -7.0, np.float32)
    offsets = list(range(0, 2 * p + 1, 2))
    with pytest.raises(ValueError, match="differs across ranks"):
        shm_alltoall.alltoall(x, out, offsets, offsets, ctx, collectives.Options())
    assert np.all(out == -7.0)
    monkeypatch.undo()
    dtype = np.float32 if r == last else np.float64
    with pytest.raises((ValueError, collectives.CollectiveError)):
        collectives.alltoall(np.ones(2 * p, dtype), counts=[2] * p, algorithm="shm")
    _still_works()
    y, got = collectives.alltoall(np.full(p, r, np.int64), counts=[1] * p, algorithm="shm")
    assert got == [1] * p and np.array_equal(y, np.arange(p)), y


@pytest.mark.world_sizes(3, 4, 5)
@pytest.mark.parametrize("bad", [None, "count"])
def test_hierarchical_equal_blocks_mismatch_then_right(bad):
    """The node-aware alltoall's equal-block path (emulated nodes of 2 ranks): the last rank's
    count differs, so a leader's receive (from its node or from another leader, which it posts
    before its node's inputs arrive) gets another size: every rank raises or is told, none
    hangs; then calls of three block sizes and dtypes, bitwise right (the withdrawn receives
    take nothing of theirs)."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    opts = collectives.Options(node_size=2)
    if bad:
        x = np.ones(p * (3 if r == p - 1 else 2), np.float64)
        try:
            collectives.alltoall(x, algorithm="hierarchical", options=opts)
            error = None
        except (ValueError, collectives.CollectiveError) as exc:
            error = exc
        assert all(comm.allgather(error is not None)), str(error)
    for k, (block, dtype) in enumerate([(1, DTYPES[3]), (5, DTYPES[1]), (3, DTYPES[2])]):
        x = _data(block * p, dtype, r, k)
        xs = comm.allgather(x)
        expected = np.concatenate([xs[i][r * block:(r + 1) * block] for i in range(p)])
        y = collectives.alltoall(x, algorithm="hierarchical", options=opts)
        assert np.array_equal(_bits(y), _bits(expected)), (block, dtype)


@pytest.mark.world_sizes(2, 3)
@pytest.mark.parametrize("bad", ["dtype", "count"])
def test_shm_alltoall_mismatch_raises_on_every_rank(bad):
    """Without validate=True a dtype of the same bytes, or a count, that differs on one rank is
    found by the descriptors' comparison before any rank reads another's data: every rank
    raises, naming the bytes and dtypes, and the next call is right."""
    comm = MPI.COMM_WORLD
    p, last = comm.size, comm.rank == comm.size - 1
    dtype = np.int32 if bad == "dtype" and last else np.float32
    x = np.ones(p * (3 if bad == "count" and last else 2), dtype)
    try:
        collectives.alltoall(x, algorithm="shm")
        error = None
    except (ValueError, collectives.CollectiveError) as exc:
        error = exc
    errors = comm.allgather(None if error is None else str(error))
    assert all(errors), errors
    assert any("count or dtype differs across ranks" in e for e in errors), errors
    _still_works()


@pytest.mark.parametrize("node_size", [1, 2, 3])
def test_hierarchical_alltoall_on_emulated_nodes(node_size, comm):
    """The node-aware alltoall across emulated nodes of ``node_size`` ranks (unequal where
    ``node_size`` does not divide p; one rank each at 1: pairwise runs), equal blocks and the v
    form with zero-length blocks, against the gathered reference, bitwise."""
    p, r = comm.size, comm.rank
    opts = collectives.Options(node_size=node_size)
    for k, block in enumerate(counts_for(p)):
        dtype = DTYPES[k % len(DTYPES)]
        x = _data(block * p, dtype, r, k)
        xs = comm.allgather(x)
        expected = np.concatenate([xs[i][r * block:(r + 1) * block] for i in range(p)])
        y = collectives.alltoall(x, algorithm="hierarchical", comm=comm, options=opts)
        assert np.array_equal(_bits(y), _bits(expected)), f"block={block} {dtype}"
        sends = [_uneven(block * p + i, p, k) for i in range(p)]
        x = _data(block * p + r, dtype, r, k + 1)
        xs = comm.allgather(x)
        offs = [np.concatenate([[0], np.cumsum(row)]).astype(int) for row in sends]
        expected = np.concatenate([xs[i][offs[i][r]:offs[i][r + 1]] for i in range(p)])
        y, got = collectives.alltoall(x, counts=sends[r], algorithm="hierarchical", comm=comm,
                                      options=opts)
        assert got == [row[r] for row in sends], f"v total={block * p} {dtype}"
        assert np.array_equal(_bits(y), _bits(expected)), f"v total={block * p} {dtype}"


def _wire(algorithm, p, r, b, node_size):
    """(bytes, messages) rank ``r`` sends in an alltoall of ``b``-byte blocks
    (docs/algorithms.md)."""
    if algorithm == "pairwise":
        return (p - 1) * b, p - 1
    if algorithm == "bruck":  # round k: the blocks with bit k set
        rounds = [1 << i for i in range((p - 1).bit_length())]
        return sum(sum(1 for i in range(p) if i & k) for k in rounds) * b, len(rounds)
    nodes = [list(range(s, min(s + node_size, p))) for s in range(0, p, node_size)]
    mine = next(m for m in nodes if r in m)
    if len(nodes) in (1, p):  # pairwise runs
        return (p - 1) * b, p - 1
    if r != mine[0]:  # the whole input to the leader
        return p * b, 1
    others = [m for m in nodes if m is not mine]  # one message per other node, then the results
    return (sum(len(mine) * len(m) * b for m in others) + (len(mine) - 1) * p * b,
            len(others) + len(mine) - 1)


@pytest.mark.world_sizes(2, 3, 4, 5)
@pytest.mark.parametrize("algorithm", ["pairwise", "bruck", "hierarchical"])
def test_alltoall_wire_bytes(algorithm):
    """``TRAFFIC`` counts what the arithmetic says each rank sends (emulated nodes of 2 ranks
    for the node-aware one)."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    opts = collectives.Options(node_size=2)
    x = np.ones(3 * p, np.float64)
    collectives.alltoall(x, algorithm=algorithm, options=opts)  # the layouts made
    collectives.TRAFFIC.reset()
    collectives.alltoall(x, algorithm=algorithm, options=opts)
    sent = collectives.TRAFFIC.reset()
    assert (sent.bytes_sent, sent.messages) == _wire(algorithm, p, r, 24, 2), algorithm


@pytest.mark.parametrize("algorithm", list(collectives.GATHER))
@pytest.mark.parametrize("uneven", [False, True])
def test_gather_every_root(algorithm, uneven, comm):
    p, r = comm.size, comm.rank
    for root in range(p):
        for k, total in enumerate(counts_for(p)):
            dtype = ROOT_DTYPES[(root + k) % len(ROOT_DTYPES)]
            counts = _uneven(total, p, root) if uneven else [total // p] * p
            x = _data(counts[r], dtype, r, k)
            expected = np.concatenate(comm.allgather(x))
            y = collectives.gather(x, root=root, counts=counts if uneven else None,
                                   algorithm=algorithm, comm=comm)
            what = f"{algorithm} root={root} counts={counts} {dtype}"
            if r != root:
                assert y is None, what
                continue
            assert y.shape == (sum(counts),) and y.dtype == dtype, what
            assert np.array_equal(_bits(y), _bits(expected)), what


@pytest.mark.parametrize("algorithm", list(collectives.SCATTER))
@pytest.mark.parametrize("uneven", [False, True])
def test_scatter_every_root(algorithm, uneven, comm):
    """Off the root: x=None with out= on even cases, a dummy x of the root's size on odd."""
    p, r = comm.size, comm.rank
    for root in range(p):
        for k, total in enumerate(counts_for(p)):
            dtype = ROOT_DTYPES[(root + k) % len(ROOT_DTYPES)]
            counts = _uneven(total, p, root) if uneven else [total // p] * p
            full = _data(sum(counts), dtype, root, k)  # the root's x, known everywhere
            offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
            out = None
            if r == root:
                x = full
            elif k % 2:
                x = np.zeros(sum(counts), dtype)  # a dummy, never read
            else:
                x, out = None, np.empty(counts[r], dtype)
            y = collectives.scatter(x, root=root, out=out, counts=counts if uneven else None,
                                    algorithm=algorithm, comm=comm)
            what = f"{algorithm} root={root} counts={counts} {dtype}"
            assert out is None or y is out, what
            assert y.shape == (counts[r],) and y.dtype == dtype, what
            assert np.array_equal(_bits(y), _bits(full[offs[r]:offs[r + 1]])), what


@pytest.mark.parametrize("algorithm", list(collectives.BARRIER))
def test_barrier(algorithm, comm):
    """No rank leaves before the last one arrives (ranks arrive 5 ms apart)."""
    p, r = comm.size, comm.rank
    collectives.barrier(algorithm=algorithm, comm=comm)
    time.sleep(0.005 * r)
    arrived = time.monotonic()
    collectives.barrier(algorithm=algorithm, comm=comm)
    left = time.monotonic()
    times = comm.allgather((arrived, left))
    assert min(t[1] for t in times) >= max(t[0] for t in times), times


def _checked_calls(monkeypatch):
    """The kinds of the calls that go through the first call's checked path (``run_call``),
    in order, from now on: a remembered repeat adds none."""
    from collectives import api

    checked = []
    run_call = api.run_call
    monkeypatch.setattr(api, "run_call", lambda cls, *a: checked.append(cls.kind) or
                        run_call(cls, *a))
    return checked


@pytest.mark.world_sizes(2, 3, 4)
@pytest.mark.parametrize("algorithm", list(collectives.ALLTOALL))
def test_repeated_calls_recheck_what_can_change(algorithm, monkeypatch):
    """A repeated ``alltoall(x, out=y)`` and ``barrier()`` run from the one cache of remembered
    calls (``_runtime/repeats.py``, without the checks of a first call: ``run_call`` counted):
    new contents arrive every time; an ``out`` made read-only or reshaped in place is checked
    again (the read-only one an error on every rank, before any message of that call), and the
    calls after it are right."""
    checked = _checked_calls(monkeypatch)
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    x = np.zeros(4 * p, np.float32)
    y = np.empty_like(x)
    for step in range(4):
        x[:] = np.arange(4 * p) + 100 * r + 1000 * step
        assert collectives.alltoall(x, out=y, algorithm=algorithm) is y
        expected = np.concatenate([np.arange(4 * r, 4 * r + 4) + 100 * i + 1000 * step
                                   for i in range(p)])
        assert np.array_equal(y, expected), (algorithm, step)
        collectives.barrier(algorithm="native" if algorithm == "native" else "auto")
    assert checked == ["alltoall", "barrier"], checked  # the first calls only
    if r == p - 1:
        y.flags.writeable = False
    try:
        collectives.alltoall(x, out=y, algorithm=algorithm)
        error = None
    except (ValueError, collectives.CollectiveError) as exc:
        error = exc
    assert all(comm.allgather(error is not None)), algorithm
    assert r != p - 1 or "read-only" in str(error), error
    y.flags.writeable = True
    y.shape = (p, 4)  # the same memory, another shape: out must have x's, checked again
    with pytest.raises(ValueError, match="shape"):
        collectives.alltoall(x, out=y, algorithm=algorithm)
    x.shape = (p, 4)
    y[:] = -1
    assert collectives.alltoall(x, out=y, algorithm=algorithm) is y
    assert np.array_equal(y.reshape(-1), expected), algorithm
    _still_works()


def _flows(p, step, size):
    """A matrix of counts whose every row and column sums to ``size`` (rank ``i`` sends
    ``C[i][j]`` to ``j``), different at each step, zeros included: the same on every rank."""
    rng = np.random.default_rng([p, step])
    counts = np.zeros((p, p), int)
    for _ in range(size):  # a sum of permutations: equal row and column sums
        counts[np.arange(p), rng.permutation(p)] += 1
    return counts


@pytest.mark.world_sizes(2, 3, 4)
@pytest.mark.parametrize("algorithm", [a for a in collectives.ALLTOALL
                                       if a not in collectives.algorithms.EQUAL_BLOCKS_ONLY])
def test_repeated_v_form_takes_new_counts(algorithm, monkeypatch):
    """A repeated ``alltoall(x, out=y, counts=c)`` runs from the one cache of remembered calls
    (``run_call`` counted: the first call only) with new counts at every step, as a mixture of
    experts' dispatch sends: the right blocks and receive counts against MPI's own alltoallv;
    counts that are wrong on one rank in a repeat, and an ``out`` whose size no longer matches
    the received total, raise on every rank; the calls after them are right."""
    checked = _checked_calls(monkeypatch)
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    size = 2 * p + 1
    x = np.empty(size, np.float64)
    y = np.empty(size, np.float64)
    for step in range(5):
        flows = _flows(p, step, size)
        counts, got = flows[r].tolist(), flows[:, r].tolist()
        x[:] = np.arange(size) + 100 * r + 1000 * step
        expected = np.empty(size)
        comm.Alltoallv([x, counts, np.cumsum([0] + counts[:-1]), MPI.DOUBLE],
                       [expected, got, np.cumsum([0] + got[:-1]), MPI.DOUBLE])
        result, out_counts = collectives.alltoall(x, out=y, counts=counts, algorithm=algorithm)
        assert result is y and out_counts == got, (algorithm, step, out_counts, got)
        assert np.array_equal(y, expected), (algorithm, step)
    assert checked == ["alltoall"], checked  # the first call only
    bad = flows[r].tolist()
    if r == p - 1:
        bad[0] += 1  # sums to size + 1: this rank's check, in the repeat
    error = None
    try:
        collectives.alltoall(x, out=y, counts=bad, algorithm=algorithm)
    except (ValueError, collectives.CollectiveError) as exc:
        error = exc
    assert all(comm.allgather(error is not None)), algorithm
    assert r != p - 1 or "sum to" in str(error), error
    # rank 1 sends one element less to rank a, one more to rank a + 1: the counts agree
    # pairwise, but those two ranks receive one element fewer and one more than y holds
    shifted = flows.copy()
    a = int(np.flatnonzero(shifted[1])[0])
    shifted[1, a] -= 1
    shifted[1, (a + 1) % p] += 1
    error = None
    try:
        collectives.alltoall(x, out=y, counts=shifted[r].tolist(), algorithm=algorithm)
    except (ValueError, collectives.CollectiveError) as exc:
        error = exc
    assert all(comm.allgather(error is not None)), (algorithm, shifted)
    counts, got = flows[r].tolist(), flows[:, r].tolist()
    y[:] = -1
    assert collectives.alltoall(x, out=y, counts=counts, algorithm=algorithm)[1] == got
    assert np.array_equal(y, expected), algorithm
    _still_works()


@pytest.mark.world_sizes(1, 2, 3)
def test_tensors_and_bfloat16_keep_their_type():
    torch = pytest.importorskip("torch")
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    x = torch.arange(2 * p, dtype=torch.bfloat16) + 100 * r
    y = collectives.alltoall(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
    expected = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.bfloat16) + 100 * i
                          for i in range(p)])
    assert torch.equal(y, expected)
    g = collectives.gather(x, root=0)
    assert (g is None) == (r != 0) and (g is None or isinstance(g, torch.Tensor))


# ---------------------------------------------------------------- errors: on every rank, no hang
def _same_error_everywhere(call, kind, comm=MPI.COMM_WORLD):
    with pytest.raises(kind) as info:
        call()
    messages = comm.allgather((type(info.value).__name__, str(info.value)))
    assert all(m == messages[0] for m in messages), messages
    return info.value


LOCAL = {
    "alltoall: not a multiple of p": lambda p: collectives.alltoall(np.ones(p + 1)),
    "alltoall: bruck with counts": lambda p: collectives.alltoall(
        np.ones(p), counts=[1] * p, algorithm="bruck"),
    "alltoall: counts wrong sum": lambda p: collectives.alltoall(np.ones(p), counts=[2] * p),
    "alltoall: counts in place": lambda p: (lambda a: collectives.alltoall(
        a, out=a, counts=[1] * p))(np.ones(p)),
    "alltoall: unknown algorithm": lambda p: collectives.alltoall(np.ones(p), algorithm="x"),
    "gather: counts[rank] != x.size": lambda p: collectives.gather(np.ones(2), counts=[1] * p),
    "gather: bad root": lambda p: collectives.gather(np.ones(2), root=p),
    "scatter: no x nor out off the root": lambda p: collectives.scatter(
        np.ones(p) if MPI.COMM_WORLD.rank == 0 else None),
    "barrier: unknown algorithm": lambda p: collectives.barrier(algorithm="x"),
}


@pytest.mark.world_sizes(1, 2, 3)
@pytest.mark.parametrize("case", list(LOCAL))
def test_bad_arguments_raise_on_every_rank(case):
    comm = MPI.COMM_WORLD
    if comm.size == 1 and case.startswith(("scatter", "alltoall: not a")):
        return  # the root alone: nothing missing; every size is a multiple of 1
    # without validate: the rank with the bad argument raises it, every rank that waits for it
    # is told (the guard); a rank that only sends (scatter's root) may finish first
    try:
        LOCAL[case](comm.size)
        error = None
    except (ValueError, collectives.CollectiveError) as exc:
        error = exc
    assert all(comm.allgather(error is not None)) or case.startswith("scatter"), case
    assert any(comm.allgather(isinstance(error, ValueError))), case
    error = _same_error_everywhere(lambda: _validated(LOCAL[case], comm.size), ValueError)
    assert "invalid arguments on rank" in str(error)
    _still_works()


def _validated(call, p):
    import os
    os.environ["COLLECTIVES_VALIDATE"] = "1"
    try:
        return call(p)
    finally:
        del os.environ["COLLECTIVES_VALIDATE"]


def _still_works(comm=MPI.COMM_WORLD):
    x = np.arange(comm.size * 3, dtype=np.int64) + 1000 * comm.rank
    for algorithm in collectives.ALLTOALL:
        y = collectives.alltoall(x, algorithm=algorithm, comm=comm)
        expected = np.concatenate([np.arange(3 * comm.rank, 3 * comm.rank + 3) + 1000 * i
                                   for i in range(comm.size)])
        assert np.array_equal(y, expected), algorithm


@pytest.mark.world_sizes(2, 3)
# (the v form learns its receive counts: a count cannot mismatch there)
@pytest.mark.parametrize("name,bad", [(n, b) for n in ("alltoall", "alltoallv", "gather", "scatter")
                                      for b in ("dtype", "count")
                                      if (n, b) != ("alltoallv", "count")])
def test_one_rank_differs(name, bad):
    """One rank's dtype or count differs: with validate=True the same ValueError on every rank;
    without, the exact-size receives of the hand-written algorithms, or native's signature
    check, raise (every rank raises or is told), and the next call is right."""
    comm = MPI.COMM_WORLD
    p, last = comm.size, comm.rank == comm.size - 1
    dtype = np.float32 if bad == "dtype" and last else np.float64
    n = p * (3 if bad == "count" and last else 2)
    x = np.ones(n, dtype)
    calls = {
        "alltoall": lambda **kw: collectives.alltoall(x, **kw),
        "alltoallv": lambda **kw: collectives.alltoall(
            x, counts=[n - (p - 1) * 2] + [2] * (p - 1), **kw),
        "gather": lambda **kw: collectives.gather(x, **kw),
        "scatter": lambda **kw: collectives.scatter(x, **kw),
    }
    error = _same_error_everywhere(lambda: calls[name](validate=True), ValueError)
    assert "arguments differ across ranks" in str(error) or "invalid arguments" in str(error)
    # without validate: the hand-written receives' exact sizes, native's signature check
    for algorithm in ("pairwise" if name.startswith("alltoall") else "binomial", "native"):
        try:
            calls[name](algorithm=algorithm)
            error = None
        except (ValueError, collectives.CollectiveError) as exc:
            error = exc
        assert any(comm.allgather(error is not None)), (name, algorithm)
    _still_works()


@pytest.mark.world_sizes(2, 3)
def test_out_of_the_wrong_size_in_the_v_form_raises_on_every_rank():
    """The v form checks out= once the receive counts are known (after the first exchange):
    the rank with the wrong out raises, and every other rank too (the guard)."""
    comm = MPI.COMM_WORLD
    p = comm.size
    out = np.empty(p + (comm.rank == 0))
    with pytest.raises((ValueError, collectives.CollectiveError)):
        collectives.alltoall(np.ones(p), counts=[1] * p, out=out)
    _still_works()


# ---------------------------------------------------------------- auto: the fitted model's argmin
def _predicted(name, b, p, m):
    """Seconds of alltoall ``name`` for ``b``-byte blocks on one node, written out plainly from
    the formulas of docs/algorithms.md (``m``: the fitted model's parameters)."""
    rounds = [sum(1 for i in range(p) if i & (1 << k)) for k in range((p - 1).bit_length())]

    def bruck(alpha):
        return sum(alpha + c * b * m["beta"] for c in rounds) + \
            (2 * p + 2 * sum(rounds)) * b * m["gamma"]

    def pairwise(alpha):
        return (p - 1) * (alpha + b * m["beta"])

    if name == "native":
        return (bruck if b <= 256 else pairwise)(m["alpha_native"]) + p * b * m["gamma"]
    return {"bruck": bruck, "pairwise": pairwise}[name](m["alpha"])


@pytest.mark.world_sizes(2, 3, 4)
def test_auto_runs_the_fitted_models_argmin(monkeypatch):
    """On one node "auto" runs the shm alltoall, for equal blocks and the v form;
    where it does not (a communicator that spans nodes, here: one said to), with a tuning file's
    fitted model, it runs, for each block size, the algorithm whose predicted time is the
    smallest (the formulas written out above); the results are right."""
    import json
    import tempfile
    from pathlib import Path

    from collectives import selection
    from collectives.algorithms import shm, shm_alltoall
    from collectives.blocks import auto

    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    took = []
    real_shm = shm_alltoall.alltoall_without_waiting
    monkeypatch.setattr(shm_alltoall, "alltoall_without_waiting",
                        lambda *a: (took.append("shm"), real_shm(*a)))
    x = np.arange(2 * p, dtype=np.float32) + 1000 * r
    want = np.concatenate([np.arange(2 * r, 2 * r + 2) + 1000 * i for i in range(p)])
    assert np.array_equal(collectives.alltoall(x, comm=comm), want)
    assert took == ["shm"], took
    collectives.alltoall(x, counts=[2] * p, comm=comm)  # the v form too
    assert took == ["shm", "shm"], took
    monkeypatch.setattr(shm, "on_one_node", lambda ctx, opts: False)
    model = {"alpha": 2e-6, "beta": 1e-10, "gamma": 1e-9, "alpha_native": 1e-6}
    folder = Path(comm.bcast(tempfile.mkdtemp() if r == 0 else None, root=0))
    if r == 0:
        (folder / "tuning.json").write_text(json.dumps({
            "format": selection.FORMAT, "version": selection.VERSION, "world_sizes": {
                str(p): {"rules": [{"max_bytes": None, "algorithm": "native"}],
                         "model": model}}}))
    comm.Barrier()
    monkeypatch.setenv(selection.ENV, str(folder / "tuning.json"))
    selection.clear_cache()
    ran = []
    for name, real in list(auto.FUNCTIONS.items()):
        monkeypatch.setitem(auto.FUNCTIONS, name,
                            lambda *a, _n=name, _f=real: (ran.append(_n), _f(*a)))
    dup = comm.Dup()
    try:
        expected_names = []
        for block in (8, 64, 256, 512, 1024, 4096, 65536):
            n = block // 4
            x = np.arange(n * p, dtype=np.float32) + 1000 * r
            y = collectives.alltoall(x, comm=dup)
            want = np.concatenate([np.arange(n * r, n * (r + 1)) + 1000 * i for i in range(p)])
            assert np.array_equal(y, want), block
            times = {a: _predicted(a, block, p, model) for a in ("pairwise", "bruck", "native")}
            expected_names.append(min(times, key=times.get))
        assert ran == expected_names, (ran, expected_names)
        assert len(set(ran)) > 1, ran  # the file's model changes the pick with the size
    finally:
        dup.Free()
        selection.clear_cache()
