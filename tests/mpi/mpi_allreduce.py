"""allreduce against the gather-and-reduce reference, for every algorithm.

Sweeps counts {0, 1, p-1, p+1, 1001} x every dtype x every op x in place / out of place (from 5
ranks on, dtypes and ops by a covering design: ``reference.sweep_cases``), on
COMM_WORLD, a split communicator and COMM_SELF, with small segments (so ring, tree and shm take the
multi-segment path: a few segments per block, ``reference.segmented``) and emulated nodes of 2 ranks (so hierarchical has several nodes; shm, which
needs one node, runs on the real one).
"""

import dataclasses
import gc

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from reference import (DTYPES, OPS, assert_close, for_algorithm, make_input, segmented,
                       sweep_cases)

SMALL = collectives.Options(segment_bytes=24, node_size=2, shm_segment_bytes=256)


def small(algorithm):
    """Options that shrink every segment; shm (one node only) keeps the real node."""
    return for_algorithm(SMALL, algorithm)


def _sweep(algorithm, comm, options, backend, dtypes=DTYPES, ops=OPS, covering=None):
    to_device, to_host = backend
    checked = 0
    for count, dtype, op, inplace in sweep_cases(comm.size, dtypes, ops, covering):
        what = f"{algorithm} p={comm.size} n={count} {dtype} {op} inplace={inplace}"
        before = make_input(count, dtype, op, comm.rank)
        x = to_device(before.copy())
        y = collectives.allreduce(x, out=x if inplace else None, op=op, algorithm=algorithm,
                                  comm=comm,
                                  options=segmented(options, count, dtype.itemsize, comm.size))
        assert (y is x) == inplace and type(y) is type(x), what
        if not inplace:
            assert np.array_equal(to_host(x).view(np.uint8), before.view(np.uint8)), \
                f"{what}: input modified"
        assert_close(to_host(y), before, op, comm, what, identical=True)
        checked += 1
    return checked


@pytest.mark.parametrize("algorithm", list(collectives.ALGORITHMS))
def test_allreduce_sweep(algorithm, comm, backend):
    assert _sweep(algorithm, comm, small(algorithm), backend) > 0


@pytest.mark.parametrize("algorithm", list(collectives.ALGORITHMS))
def test_allreduce_default_options_large_odd(algorithm):
    comm = MPI.COMM_WORLD
    for dtype in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64)):
        x = make_input(100_003, dtype, "sum", comm.rank)
        y = collectives.allreduce(x, algorithm=algorithm)
        assert_close(y, x, "sum", comm, f"{algorithm} {dtype}", identical=True)


def test_native_in_pieces_matches_the_reference(monkeypatch, comm, backend):
    """Under the guard, native runs a long vector in pieces through a small landing buffer
    (algorithms/native.py): here pieces of 256 bytes, so every count above 256 bytes takes
    several, the last one short."""
    from collectives.algorithms import native

    monkeypatch.setattr(native, "LANDING_BYTES", 256)
    assert _sweep("native", comm, small("native"), backend) > 0


@pytest.mark.parametrize("algorithm", list(collectives.ALGORITHMS))
def test_multidimensional_and_fortran_order(algorithm):
    comm = MPI.COMM_WORLD
    x = np.asfortranarray(make_input(35, np.dtype(np.float64), "sum", comm.rank).reshape(5, 7))
    y = collectives.allreduce(x, algorithm=algorithm, options=small(algorithm))
    assert y.shape == (5, 7) and y.flags.f_contiguous
    assert_close(y, x, "sum", comm, algorithm)
    out = np.empty((5, 7), order="F")
    assert collectives.allreduce(x, out=out, algorithm=algorithm) is out
    assert_close(out, x, "sum", comm, algorithm)


def test_mpi_op_objects_match_names():
    comm = MPI.COMM_WORLD
    x = make_input(17, np.dtype(np.int32), "sum", comm.rank)
    for obj, name in [(MPI.SUM, "sum"), (MPI.PROD, "prod"), (MPI.MIN, "min"), (MPI.MAX, "max")]:
        assert np.array_equal(collectives.allreduce(x, op=obj),
                              collectives.allreduce(x, op=name)), name


def test_native_float16_user_op_fallback():
    """Where MPI has no float16 type (Open MPI), native reduces float16 with a user-defined op."""
    from collectives._runtime.mpitypes import native_op, native_type
    from collectives.ops import OPS as TABLE

    comm = MPI.COMM_WORLD
    for op in ("sum", "min", "max", "prod"):
        x = make_input(101, np.dtype(np.float16), op, comm.rank)
        y = np.empty_like(x)
        comm.Allreduce([x, native_type(x.dtype, force_user_op=True)],
                       [y, native_type(x.dtype, force_user_op=True)],
                       native_op(TABLE[op], x.dtype, force_user_op=True))
        assert_close(y, x, op, comm, f"user op {op}")


@pytest.mark.world_sizes(1, 2, 3)  # the repeat cache
def test_repeated_calls_reuse_checks_safely(monkeypatch):
    """allreduce(x, out=y) repeated with the same arrays skips its checks (the cache of
    _runtime/repeats.py); what can change in place between calls is noticed: shape, dtype,
    write flag, options, a freed communicator, a new array at a recycled address."""
    from collectives._runtime.repeats import REPEATS as _REPEATS

    world = MPI.COMM_WORLD
    comm = world.Dup()
    p = comm.size
    x = make_input(1001, np.dtype(np.float64), "sum", comm.rank)
    y = np.empty_like(x)
    first = collectives.allreduce(x, out=y, comm=comm).copy()
    assert_close(first, x, "sum", comm, "first call")
    for algorithm in ("auto", "native", "ring"):
        once = collectives.allreduce(x, out=y, comm=comm, algorithm=algorithm).copy()
        before = len(_REPEATS.entries)
        for _ in range(3):  # repeats: remembered, bitwise the first call's result
            y[...] = 0
            assert collectives.allreduce(x, out=y, comm=comm, algorithm=algorithm) is y
            assert np.array_equal(y.view(np.uint8), once.view(np.uint8)), algorithm
        assert len(_REPEATS.entries) == before
        assert_close(y, x, "sum", comm, f"repeat {algorithm}")
        fresh = collectives.allreduce(x.copy(), comm=comm, algorithm=algorithm)  # not a repeat
        assert np.array_equal(fresh.view(np.uint8), once.view(np.uint8)), algorithm
    z = np.full(5, comm.rank + 1, dtype=np.int64)  # in place, repeated: each call sums again
    for k in range(3):
        assert collectives.allreduce(z, out=z, comm=comm) is z
        assert np.array_equal(z, np.full(5, p * (p + 1) // 2 * p ** k)), k
    z[...] = comm.rank + 1  # in place, changed in place: checked again
    z.shape = (5, 1)
    assert collectives.allreduce(z, out=z, comm=comm).shape == (5, 1)
    assert np.array_equal(z, np.full((5, 1), p * (p + 1) // 2))
    z.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        collectives.allreduce(z, out=z, comm=comm)
    z.flags.writeable = True
    z.dtype = np.float64  # the same memory, another dtype: summed as floats
    z[...] = 1.5
    assert collectives.allreduce(z, out=z, comm=comm).dtype == np.float64
    assert np.array_equal(z, np.full((5, 1), 1.5 * p))
    x.shape = y.shape = (7, 143)  # reshaped in place: checked again, right shape out
    assert collectives.allreduce(x, out=y, comm=comm).shape == (7, 143)
    for _ in range(2):  # repeats of a 2-D call: through flat views
        y[...] = 0
        assert collectives.allreduce(x, out=y, comm=comm) is y
        assert_close(y, x, "sum", comm, "2-D repeat")
    x.shape = (1001,)
    with pytest.raises(ValueError, match="shape"):
        collectives.allreduce(x, out=y, comm=comm)
    y.shape = (1001,)
    y.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        collectives.allreduce(x, out=y, comm=comm)
    y.flags.writeable = True
    for k in range(5):  # new arrays, possibly at recycled addresses
        a = np.full(1001, float(k + comm.rank))
        b = np.empty_like(a)
        collectives.allreduce(a, out=b, comm=comm)
        assert np.array_equal(b, np.full(1001, p * k + p * (p - 1) / 2))
        del a, b
    half = comm.Split(comm.rank % 2)  # the same arrays in turn on two communicators, two ops
    c = np.full(4, comm.rank + 1, dtype=np.int64)
    d = np.empty_like(c)
    mates = half.allgather(comm.rank)
    for _ in range(3):
        assert np.array_equal(collectives.allreduce(c, out=d, comm=comm),
                              np.full(4, p * (p + 1) // 2))
        assert np.array_equal(collectives.allreduce(c, out=d, comm=half),
                              np.full(4, sum(r + 1 for r in mates)))
        assert np.array_equal(collectives.allreduce(c, out=d, op="max", comm=half),
                              np.full(4, max(mates) + 1))
    half.Free()
    if p > 1:  # new options on the same arrays: checked once, then remembered with them
        from collectives import api

        checked = []
        original = api.run_call
        monkeypatch.setattr(api, "run_call", lambda *a: checked.append(a[0]) or original(*a))
        for options in (collectives.Options(), collectives.Options(segment_bytes=4096)):
            for _ in range(3):
                collectives.allreduce(c, out=d, comm=comm, options=options)
                assert np.array_equal(d, np.full(4, p * (p + 1) // 2))
        assert len(checked) == 2
        # a loop of a few calls (two pairs of arrays, two ops): each checked once, then found
        # among the recent entries by identity, with no keyed lookup
        looked_up = []

        class Counting(dict):
            def get(self, *args):
                looked_up.append(args[0])
                return super().get(*args)

        monkeypatch.setattr(_REPEATS, "entries", Counting(_REPEATS.entries))
        e = np.full(6, comm.rank + 1.0)
        f = np.empty_like(e)
        checked.clear()
        for k in range(4):
            if k == 1:
                looked_up.clear()
            for a, b, op, want in ((c, d, "sum", p * (p + 1) // 2), (e, f, "sum", p * (p + 1) / 2),
                                   (c, d, "max", p), (e, f, "max", float(p))):
                b[...] = 0
                assert collectives.allreduce(a, out=b, op=op, comm=comm) is b
                assert np.array_equal(b, np.full(b.size, want)), (k, op)
        assert len(checked) == 4 and not looked_up, (checked, looked_up)
        assert len(_REPEATS.recent) == _REPEATS.RECENT
        # the names equal in value but other objects (made at run time): still a repeat
        checked.clear()
        for _ in range(3):
            name, how = "".join(["s", "um"]), "".join(["au", "to"])
            d[...] = 0
            assert collectives.allreduce(c, out=d, op=name, algorithm=how, comm=comm) is d
            assert np.array_equal(d, np.full(4, p * (p + 1) // 2))
        assert not checked
        with pytest.raises((TypeError, ValueError), match="op"):  # not a name: the full check
            collectives.allreduce(c, out=d, op=np.array([1, 2]), comm=comm)
        monkeypatch.setattr(api, "run_call", original)
    for x_gone in (True, False):  # a remembered call's arrays gone: None is not taken for them
        a, b = np.ones(3), np.ones(3)
        for _ in range(2):  # remembered, then the most recent entry
            collectives.allreduce(a, out=b, comm=comm)
        kept = b if x_gone else a
        del a, b
        gc.collect()
        with pytest.raises(TypeError, match="must be a numpy.ndarray"):
            collectives.allreduce(None, out=None if not x_gone else kept, comm=comm)
        if not x_gone:  # out gone, x alive: a new array in out's place is not out
            assert collectives.allreduce(kept, out=None, comm=comm) is not kept
    monkeypatch.setenv("COLLECTIVES_VALIDATE", "1")  # options in force changed: validated
    if p > 1:
        bad = np.ones(3 + (comm.rank == 0))
        with pytest.raises(ValueError, match="arguments differ"):
            collectives.allreduce(bad, out=np.empty_like(bad), comm=comm)
    monkeypatch.setenv("COLLECTIVES_VALIDATE", "0")
    collectives.allreduce(x, out=y, comm=comm)
    comm.Free()
    with pytest.raises(TypeError, match="intracommunicator"):
        collectives.allreduce(x, out=y, comm=comm)


@pytest.fixture
def checked_calls(monkeypatch):
    """A duplicate of the world and the list of the call classes that blocking calls check in
    full (``api.run_call``): a repeat found in the cache adds none."""
    from collectives import api

    comm = MPI.COMM_WORLD.Dup()
    checked = []
    original = api.run_call
    monkeypatch.setattr(api, "run_call", lambda *a: checked.append(a[0]) or original(*a))
    yield comm, checked
    comm.Free()


@pytest.mark.world_sizes(2, 3)  # the repeat cache: no odd-size dependence
@pytest.mark.mpi(min_size=2)
def test_allreduce_and_iallreduce_share_one_repeat_cache(checked_calls):
    """The blocking and the non-blocking repeats are entries of one cache (_runtime/repeats.py):
    each form finds its own entry of the same arrays, and the SIZE entries are shared, the least
    recently used evicted whichever form made it: SIZE iallreduce calls on other arrays evict a
    remembered allreduce, whose next call is checked again (with a cache per form it would not
    be)."""
    from collectives import api
    from collectives._runtime.repeats import REPEATS

    comm, checked = checked_calls
    p = comm.size
    x = np.full(8, comm.rank + 1.0)
    y = np.empty_like(x)
    for _ in range(2):
        y[...] = 0
        assert collectives.allreduce(x, out=y, comm=comm) is y
        assert np.array_equal(y, np.full(8, p * (p + 1) / 2))
        y[...] = 0
        assert collectives.iallreduce(x, out=y, comm=comm).wait() is y
        assert np.array_equal(y, np.full(8, p * (p + 1) / 2))
    assert len(checked) == 1  # the blocking call's first; its repeat found its entry
    mine = [e for e in REPEATS.entries.values() if e.x() is x and e.out() is y]
    assert sorted(e.form for e in mine) == ["allreduce", "iallreduce"]
    kept = []
    for k in range(REPEATS.SIZE):
        a = np.full(4, float(k + comm.rank))
        kept.append((a, np.empty_like(a)))
        collectives.iallreduce(a, out=kept[-1][1], comm=comm).wait()
    assert len(REPEATS.entries) == REPEATS.SIZE
    assert not [e for e in REPEATS.entries.values() if e.x() is x]
    checked.clear()
    y[...] = 0
    assert collectives.allreduce(x, out=y, comm=comm) is y
    assert np.array_equal(y, np.full(8, p * (p + 1) / 2))
    assert checked == [api.AllreduceCall]  # evicted by the iallreduce calls: checked again


@pytest.mark.world_sizes(2, 3)  # the repeat cache: no odd-size dependence
@pytest.mark.mpi(min_size=2)
def test_a_remembered_call_keeps_the_options_of_its_first_call(checked_calls, monkeypatch):
    """A call made without options= reads the environment (Options.from_env, at every call);
    once remembered, its repeats keep the options its first call read, as NCCL and MPI read
    their environment at initialisation: a change of COLLECTIVES_* reaches the next call on
    other arrays, and a repeat through options=Options.from_env(), which is checked again."""
    from collectives._runtime.repeats import REPEATS

    comm, checked = checked_calls
    p = comm.size
    x = np.full(8, comm.rank + 1.0)
    y = np.empty_like(x)
    monkeypatch.delenv("COLLECTIVES_SEGMENT_BYTES", raising=False)
    collectives.allreduce(x, out=y, comm=comm)
    monkeypatch.setenv("COLLECTIVES_SEGMENT_BYTES", "4096")
    for _ in range(2):
        assert np.array_equal(collectives.allreduce(x, out=y, comm=comm),
                              np.full(8, p * (p + 1) / 2))
    assert len(checked) == 1
    assert REPEATS.recent[0].opts.segment_bytes == collectives.Options.segment_bytes
    for _ in range(2):  # the environment of now, explicitly: checked once, then remembered
        collectives.allreduce(x, out=y, comm=comm, options=collectives.Options.from_env())
    assert len(checked) == 2 and REPEATS.recent[0].opts.segment_bytes == 4096
    z = np.empty_like(x)  # other arrays: a first call, which reads the environment
    collectives.allreduce(x, out=z, comm=comm)
    assert len(checked) == 3 and REPEATS.recent[0].opts.segment_bytes == 4096


@pytest.mark.world_sizes(2, 3, 4)  # the lane: MPI_Allreduce resolved once
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("on_error", ["raise", "abort"])
def test_native_repeats_run_its_lane_with_the_same_bits(on_error, monkeypatch, comm):
    """Repeated native calls on the same arrays (a remembered allreduce, plan(), a remembered
    iallreduce) run through native's lane, with the MPI datatype and operation resolved once
    (``native.Lane``; float16 by a user-defined op where MPI has no float16), in both failure
    modes: every op, in place and not, 2-D (flat views) and 1-D, a long vector in pieces of a
    256-byte landing buffer (raise mode); the bits of a call on new arrays, and the
    reference."""
    if comm.size == 1:  # COMM_SELF (the comm fixture): nothing to reduce
        pytest.skip("one process: nothing to reduce (no native call)")
    from collectives.algorithms import native

    monkeypatch.setattr(native, "LANDING_BYTES", 256)
    calls = [0]
    lane = native.Lane.__call__

    def counted(self, *args):
        calls[0] += 1
        return lane(self, *args)

    monkeypatch.setattr(native.Lane, "__call__", counted)
    opts = collectives.Options(on_error=on_error)
    for dtype in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.int64),
                  np.dtype(np.uint8)):
        for op in OPS:
            if op == "avg" and dtype.kind != "f":
                continue  # avg is for floating dtypes
            for shape, inplace in (((7, 3), False), ((5,), True), ((1001,), False)):
                what = f"{on_error} {dtype} {op} {shape} inplace={inplace}"
                before = make_input(int(np.prod(shape)), dtype, op, comm.rank).reshape(shape)
                fresh = collectives.allreduce(before.copy(), op=op, algorithm="native",
                                              comm=comm, options=opts)
                assert_close(fresh, before, op, comm, what, identical=True)
                x = before.copy()
                y = x if inplace else np.empty_like(x)
                plan = collectives.allreduce_init(x, out=y, op=op, algorithm="native",
                                                  comm=comm, options=opts)
                runs = {
                    "allreduce": lambda: collectives.allreduce(
                        x, out=y, op=op, algorithm="native", comm=comm, options=opts),
                    "plan()": plan,
                    "iallreduce": lambda: collectives.iallreduce(
                        x, out=y, op=op, algorithm="native", comm=comm, options=opts).wait()}
                for k in range(3):
                    for name, run in runs.items():
                        x[...] = before
                        calls[0] = 0
                        assert run() is y, (what, name, k)
                        # a remembered allreduce from its first repeat on; plan() and a
                        # remembered iallreduce from their first run, which decides
                        assert calls[0] == (k > 0 or name != "allreduce"), (what, name, k, calls)
                        assert np.array_equal(y.view(np.uint8), fresh.view(np.uint8)), \
                            (what, name, k)


@pytest.mark.world_sizes(1, 2, 3)  # the repeat cache
def test_reset_reaches_remembered_calls_and_plans():
    """After ``collectives.reset(comm)`` a remembered allreduce and a plan run on the
    communicator's new context. They kept the freed one, and filled it again: a new shared
    window on a duplicate already released, and a closed guard."""
    from collectives._runtime.context import context
    from collectives._runtime.repeats import REPEATS

    comm = MPI.COMM_WORLD.Dup()
    x = make_input(1001, np.dtype(np.float64), "sum", comm.rank)
    y = np.empty_like(x)
    plan = collectives.allreduce_init(x, out=np.empty_like(x), comm=comm)
    for _ in range(2):
        collectives.allreduce(x, out=y, comm=comm)
        plan()
    old = context(comm)
    collectives.reset(comm)
    for _ in range(2):
        assert_close(collectives.allreduce(x, out=y, comm=comm), x, "sum", comm, "after reset")
        assert_close(plan(), x, "sum", comm, "plan after reset")
    new = context(comm)
    assert new is not old and not old.live and not old.cache, old.cache
    if comm.size > 1:  # one process: a trivial call, never remembered
        assert REPEATS.recent[0].where is new
    comm.Free()


@pytest.mark.parametrize("algorithm", list(collectives.ALGORITHMS))
def test_abort_mode_matches_the_reference(algorithm):
    """Options.on_error="abort" runs the algorithms as plain blocking MPI (_runtime/abort_mode.py):
    the same results, every count, blocking, repeated (the remembered-call path) and as a plan;
    and the blocks and the compressed allreduce in that mode too."""
    comm = MPI.COMM_WORLD
    # emulated nodes of 2 ranks (hierarchical has several), default segments: the sweep above
    # covers the segmentation, which abort mode does not change
    options = dataclasses.replace(small(algorithm), on_error="abort", segment_bytes=1 << 20,
                                  shm_segment_bytes=None)
    for count, dtype, op, inplace in sweep_cases(comm.size, (np.dtype(np.float32),), ("sum",)):
        what = f"abort {algorithm} p={comm.size} n={count} {dtype} {op} inplace={inplace}"
        before = make_input(count, dtype, op, comm.rank)
        x = before.copy()
        opts = options
        for _ in range(2):  # the second call repeats the first: remembered checks
            x[...] = before
            y = collectives.allreduce(x, out=x if inplace else np.empty_like(x), op=op,
                                      algorithm=algorithm, comm=comm, options=opts)
            assert_close(y, before, op, comm, what, identical=True)
        plan = collectives.allreduce_init(before, op=op, algorithm=algorithm, comm=comm,
                                          options=opts)
        assert_close(plan(), before, op, comm, what + " plan")
    x = make_input(comm.size * 3 + 1, np.dtype(np.float32), "sum", comm.rank)
    gathered = collectives.allgather(x, comm=comm, options=options)
    assert np.array_equal(gathered.reshape(comm.size, -1)[comm.rank], x)
    assert np.array_equal(collectives.bcast(x, root=comm.size - 1, comm=comm, options=options),
                          comm.bcast(x, root=comm.size - 1))
    dense = collectives.compressed_allreduce(x, "none", op="sum", comm=comm, options=options)
    assert_close(dense, x, "sum", comm, "compressed none, abort mode")
