"""Bad input: a clear error on every rank that got it, before any message is sent.

With ``validate=True`` (or COLLECTIVES_VALIDATE=1) arguments that differ across ranks, and a bad
argument on a single rank, raise the same error on every rank instead of hanging.
"""

import os
import re
import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from reference import gather_all, make_input, reference_allreduce

# Error paths: one rank, two, and an odd number (more ranks than a 2-core machine's cores) cover
# them; the collectives underneath run at every size elsewhere (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3)

ALL_CALLS = {
    "allreduce": lambda x, **kw: collectives.allreduce(x, **kw),
    "reduce_scatter": lambda x, **kw: collectives.reduce_scatter(x, **kw),
    "allgather": lambda x, **kw: collectives.allgather(x, **kw),
    "bcast": lambda x, **kw: collectives.bcast(x, **kw),
    "reduce": lambda x, **kw: collectives.reduce(x, **kw),
}


def _still_works(comm=MPI.COMM_WORLD):
    """A correct allreduce right after an error: no stray message was left in flight."""
    x = make_input(257, np.dtype(np.int64), "sum", comm.rank)
    for algorithm in collectives.ALGORITHMS:
        y = collectives.allreduce(x, algorithm=algorithm, comm=comm)
        assert np.array_equal(y, reference_allreduce(x, "sum", comm)), algorithm


LOCAL_ERRORS = [
    (lambda: collectives.allreduce(np.ones(4), algorithm="bogus"), ValueError,
     "unknown algorithm 'bogus'; valid choices: ring, tree"),
    (lambda: collectives.allreduce(np.ones(4), op="xor"), ValueError, "valid ops: sum, prod"),
    (lambda: collectives.allreduce(np.ones(4), op=MPI.BXOR), ValueError, "unsupported MPI op"),
    (lambda: collectives.allreduce(np.ones(4, bool)), TypeError, "supported dtypes: float16"),
    (lambda: collectives.allreduce(np.ones(4, np.complex64)), TypeError, "unsupported dtype"),
    (lambda: collectives.allreduce([1.0, 2.0]), TypeError, "must be a numpy.ndarray"),
    (lambda: collectives.allreduce(np.ones(8)[::2]), ValueError, "must be contiguous"),
    (lambda: collectives.allreduce(np.ones(4), out=np.ones(5)), ValueError, "shape"),
    (lambda: collectives.allreduce(np.ones(4), out=np.ones(4, np.float32)), ValueError, "dtype"),
    (lambda: collectives.allreduce(np.ones((2, 3)), out=np.ones((2, 3), order="F")), ValueError,
     "memory order"),
    (lambda: collectives.allreduce(np.ones(4, np.int32), op="avg"), TypeError, "floating"),
    (lambda: collectives.allreduce(np.ones(4), comm="world"), TypeError, "intracommunicator"),
    (lambda: (lambda a: collectives.allreduce(a[:4], out=a[2:6]))(np.ones(8)), ValueError,
     "overlaps"),
    (lambda: collectives.allreduce(np.ones(4), options=collectives.Options(inter_algorithm="x")),
     ValueError, "unknown inter_algorithm"),
    # options of the wrong type: raised inside the guard by the one blocking-call path
    (lambda: collectives.allreduce(np.ones(4), options={"timeout": 1}), TypeError,
     "options must be a collectives.Options, got dict"),
    (lambda: collectives.compressed_allreduce(np.ones(4), "fp16", options="fast"), TypeError,
     "options must be a collectives.Options, got str"),
    (lambda: collectives.neighbor_allreduce(
        np.ones(4), collectives.topology.ring(MPI.COMM_WORLD.size), options=3), TypeError,
     "options must be a collectives.Options, got int"),
    (lambda: collectives.bcast(np.ones(4), root=MPI.COMM_WORLD.size), ValueError, "root must be"),
    (lambda: collectives.reduce(np.ones(4), root=-1), ValueError, "root must be"),
    (lambda: collectives.reduce_scatter(np.ones(4), counts=[4] * (MPI.COMM_WORLD.size + 1)),
     ValueError, "counts must be"),
    (lambda: collectives.reduce_scatter(np.ones(4), counts=[5] + [0] * (MPI.COMM_WORLD.size - 1)),
     ValueError, "counts sum to 5"),
    (lambda: collectives.allgather(np.ones(4), counts=[3] * MPI.COMM_WORLD.size), ValueError,
     "counts["),
    (lambda: collectives.allgather(np.ones(4), algorithm="binomial"), ValueError,
     "valid choices: ring, native"),
    (lambda: collectives.bcast(np.ones(4), algorithm="ring"), ValueError,
     "valid choices: binomial, native"),
]


@pytest.mark.parametrize("case", range(len(LOCAL_ERRORS)))
def test_local_errors_on_every_rank(case):
    call, kind, text = LOCAL_ERRORS[case]
    with pytest.raises(kind, match=None) as info:
        call()
    assert text in str(info.value), str(info.value)


def test_error_on_one_rank_reaches_every_rank():
    """Rank 0 alone gets a bad argument and raises before sending anything; the other ranks
    make a valid call (the same one, as MPI requires) and raise too, naming rank 0, instead of
    waiting for it (docs/reliability.md). Nothing of the failed calls is left for later ones."""
    comm = MPI.COMM_WORLD
    for call, kind, text in LOCAL_ERRORS:
        if text == "intracommunicator":
            continue  # not a call on COMM_WORLD at all
        if comm.rank == 0:
            with pytest.raises(kind, match=None) as info:
                call()
            assert text in str(info.value), str(info.value)
        else:
            try:  # (an argument that was meant for rank 0 only, valid here)
                collectives.allreduce(np.ones(4), algorithm="ring")
            except (kind, collectives.CollectiveError) as exc:
                assert "failed on rank 0" in str(exc) and text in str(exc), str(exc)
    _still_works()


def test_options_check_themselves():
    with pytest.raises(ValueError, match="segment_bytes"):
        collectives.Options(segment_bytes=0)
    with pytest.raises(ValueError, match="node_size"):
        collectives.Options(node_size=0)
    with pytest.raises(ValueError, match="flat algorithm"):
        collectives.Options(inter_algorithm="hierarchical")


MISMATCHES = {
    "count": lambda r: dict(x=np.ones(4 + (r == 0))),
    "dtype": lambda r: dict(x=np.ones(4, np.float32 if r == 0 else np.float64)),
    "op": lambda r: dict(x=np.ones(4), op="max" if r == 0 else "sum"),
    "algorithm": lambda r: dict(x=np.ones(4), algorithm="ring" if r == 0 else "tree"),
}


@pytest.mark.parametrize("field", list(MISMATCHES))
def test_validate_catches_mismatch_on_every_rank(field):
    comm = MPI.COMM_WORLD
    kwargs = MISMATCHES[field](comm.rank)
    if comm.size == 1:
        collectives.allreduce(validate=True, **kwargs)  # nothing to disagree with
        return
    with pytest.raises(ValueError) as info:
        collectives.allreduce(validate=True, **kwargs)
    assert f"arguments differ across ranks ({field}: rank 0:" in str(info.value)
    messages = comm.allgather(str(info.value))
    assert all(m == messages[0] for m in messages), "ranks raised different errors"
    _still_works()


def test_validate_spreads_a_local_error_to_every_rank():
    comm = MPI.COMM_WORLD
    algorithm = "bogus" if comm.rank == comm.size - 1 else "ring"
    with pytest.raises(ValueError) as info:
        collectives.allreduce(np.ones(4), algorithm=algorithm, validate=True)
    assert f"invalid arguments on rank {comm.size - 1}: unknown algorithm 'bogus'" \
        in str(info.value)
    _still_works()


@pytest.mark.parametrize("name", ["reduce_scatter", "bcast", "reduce", "allgather"])
def test_validate_blocks(name):
    comm = MPI.COMM_WORLD
    x = np.ones(6 if comm.rank == 0 else 5)
    if comm.size == 1:
        ALL_CALLS[name](x, validate=True)
        return
    with pytest.raises(ValueError, match="arguments differ across ranks"):
        ALL_CALLS[name](x, validate=True)
    _still_works()


def test_validate_from_environment(monkeypatch):
    comm = MPI.COMM_WORLD
    monkeypatch.setenv("COLLECTIVES_VALIDATE", "1")
    x = np.ones(3 + comm.rank)
    if comm.size > 1:
        with pytest.raises(ValueError, match="count: rank 0: 3, rank 1: 4"):
            collectives.allreduce(x)
    monkeypatch.setenv("COLLECTIVES_VALIDATE", "0")
    _still_works()


def test_errors_on_split_communicator():
    world = MPI.COMM_WORLD
    sub = world.Split(world.rank % 2, world.rank)
    if sub.size > 1:
        with pytest.raises(ValueError, match="arguments differ"):
            collectives.allreduce(np.ones(2 + sub.rank), comm=sub, validate=True)
    _still_works(sub)
    sub.Free()


class _Sub(np.ndarray):
    """A user's own ndarray subclass."""


SUBCLASSES = {
    "matrix": lambda a: np.matrix(a.reshape(3, -1)),
    "memmap-like": lambda a: a.view(_Sub),
    "recarray": lambda a: a.view(np.recarray),
}


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix's own
@pytest.mark.parametrize("kind", list(SUBCLASSES))
def test_ndarray_subclasses_are_arrays(kind):
    """np.matrix, a subclass of one's own: taken as plain arrays by every algorithm and block,
    in place too (ring and rabenseifner raised ModuleNotFoundError: cupy; tree hung)."""
    comm = MPI.COMM_WORLD
    base = make_input(6 * comm.size, np.dtype(np.float64), "sum", comm.rank)
    ref = reference_allreduce(base, "sum", comm)
    for algorithm in collectives.ALGORITHMS:
        x = SUBCLASSES[kind](base.copy())
        y = collectives.allreduce(x, algorithm=algorithm)
        assert type(y) is np.ndarray and np.allclose(y.ravel(), ref), algorithm
        collectives.allreduce(x, out=x, algorithm=algorithm)
        assert np.allclose(np.asarray(x).ravel(), ref), algorithm
    x = SUBCLASSES[kind](base.copy())
    assert np.allclose(collectives.allgather(x), gather_all(base, comm).ravel())
    assert np.array_equal(collectives.reduce_scatter(x), collectives.reduce_scatter(base))
    y = collectives.reduce(x, root=0)
    assert comm.rank != 0 or np.allclose(y.ravel(), ref)
    collectives.bcast(x, root=comm.size - 1)
    assert np.array_equal(np.asarray(x).ravel(), comm.bcast(base, root=comm.size - 1))
    import compress
    y = collectives.compressed_allreduce(SUBCLASSES[kind](base.astype(np.float32)),
                                         compress.get("none"), op="sum")
    # float32 sums of p standard normals: a few float32 roundings of |x| ~ 1 (atol: near zero)
    assert type(y) is np.ndarray and np.allclose(y.ravel(), ref, rtol=1e-5, atol=1e-5)
    _still_works()


def test_masked_arrays_raise_on_every_rank():
    """A masked array's mask would be ignored: TypeError, from every collective, every rank."""
    import compress
    x = np.ma.array(np.ones(4), mask=[0, 1, 0, 0])
    for call in ALL_CALLS.values():
        with pytest.raises(TypeError, match="masked array"):
            call(x)
    with pytest.raises(TypeError, match="masked array"):
        collectives.allreduce(np.ones(4), out=x)
    with pytest.raises(TypeError, match="masked array"):
        collectives.compressed_allreduce(x.astype(np.float32), compress.get("none"))
    _still_works()


def _raises_everywhere(call, kinds=(ValueError, TypeError, collectives.CollectiveError)):
    """Run ``call`` on every rank; return this rank's error (every rank must raise one)."""
    with pytest.raises(kinds) as info:
        call()
    return info.value


def test_error_on_one_rank_never_corrupts_the_next_call():
    """Issue 11, item 1: reduce(buf[:5], out=buf[1:6]) raises on the root only (partial
    overlap); the next allreduce used to receive the other rank's message of the failed call
    (tree: 8 instead of 2 at p = 2). Messages of different calls never match now."""
    comm = MPI.COMM_WORLD
    for algorithm in collectives.ALGORITHMS:
        buf = np.arange(8.0)
        if comm.rank == 0:
            with pytest.raises(ValueError, match="overlaps"):
                collectives.reduce(buf[:5], out=buf[1:6], root=0)
        else:
            try:  # a rank that had sent its part may return; one still waiting raises
                collectives.reduce(buf[:5], out=buf[1:6], root=0)
            except ValueError as exc:
                assert "failed on rank 0: ValueError: out overlaps" in str(exc), str(exc)
        y = collectives.allreduce(np.ones(5), algorithm=algorithm)
        assert np.array_equal(y, np.full(5, float(comm.size))), (algorithm, y)
    _still_works()


COUNT_MISMATCH = {
    "count": lambda r: np.ones(1000 + (r == 0)),
    "dtype": lambda r: np.ones(1000, np.float32 if r == 0 else np.float64),
    "count-small": lambda r: np.ones(3 + 2 * (r == 0)),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", list(COUNT_MISMATCH))
def test_count_or_dtype_mismatch_raises_on_every_rank(case):
    """Issue 11, item 10: without validate=True, a count or dtype that differs across ranks
    hung the hand-written algorithms (or gave one rank wrong data): the receives are posted
    with the exact size expected, so a longer or shorter message raises ValueError, and every
    rank still waiting gets it; the next call is right."""
    comm = MPI.COMM_WORLD
    x = COUNT_MISMATCH[case](comm.rank)
    # message sizes for the message-based algorithms; for "shm" and hierarchical's phases in a
    # node (one shared window) the descriptor each rank publishes, which the others compare
    two_nodes = collectives.Options(node_size=max(1, comm.size // 2))
    for algorithm, options in [("ring", None), ("tree", None), ("recursive_doubling", None),
                               ("rabenseifner", None), ("shm", None), ("hierarchical", None),
                               ("hierarchical", two_nodes)]:
        error = _raises_everywhere(
            lambda: collectives.allreduce(x, algorithm=algorithm, options=options))
        assert "count or dtype differs across ranks" in str(error), (algorithm, str(error))
        # it names a user's array (its bytes), not only an algorithm's block
        named = {int(m.group(1) or m.group(2)) for m in re.finditer(
            r"has \d+ elements of \w+ \((\d+) bytes\)|has (\d+) bytes of \w+", str(error))}
        assert named and named <= set(comm.allgather(x.nbytes)), (algorithm, str(error))
    for name in ("reduce_scatter", "allgather", "bcast", "reduce"):
        if name == "allgather" and case != "dtype":
            continue  # allgather's blocks may differ (counts=); its dtype may not
        try:  # a rank that only sends (bcast's root, reduce's leaves) may finish first
            ALL_CALLS[name](x.copy())
            error = None
        except (ValueError, collectives.CollectiveError) as exc:
            error = exc
            assert "count or dtype differs across ranks" in str(error), (name, str(error))
        assert any(comm.allgather(error is not None)), name
    _still_works()


@pytest.mark.mpi(min_size=2)
def test_shm_op_mismatch_raises_on_every_rank(shm_driver):
    """The shared window's descriptors also carry the op: "sum" on one rank and "max" on
    another is an error on every rank for "shm", not a silent mix (the message-based algorithms
    need validate=True for that)."""
    comm = MPI.COMM_WORLD
    for count in (3, 100_000):  # both modes: every rank reduces all / its block
        x = np.ones(count)
        op = "max" if comm.rank == comm.size - 1 else "sum"
        error = _raises_everywhere(lambda: collectives.allreduce(x, op=op, algorithm="shm"))
        assert "the call differs (op or mode) across ranks" in str(error), str(error)
    _still_works()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("when", ["before", "after"])
def test_failed_shm_call_never_corrupts_the_next(monkeypatch, when, shm_driver):
    """A rank that fails before its part of a shared-memory call (the others wait in the window
    and get its notice), or right after it: the window's round counters of the failed call
    are left behind. Calls are numbered from the guard's call number, so the next call (with
    other data) is right on every rank, with no ``collectives.reset``."""
    from collectives._runtime.shmem.team import Team

    comm = MPI.COMM_WORLD
    original = Team.run

    def failing(self, *args):
        if when == "after":
            original(self, *args)
        raise RuntimeError("injected")

    for algorithm, options in [("shm", None), ("hierarchical", None),
                               ("hierarchical", collectives.Options(node_size=2))]:
        for count in (5, 3001, 200_001):
            x = np.full(count, 1000.0 + comm.rank)
            if comm.rank == 0:
                monkeypatch.setattr(Team, "run", failing)
            try:
                collectives.allreduce(x, algorithm=algorithm, options=options)
            except (RuntimeError, collectives.CollectiveError):
                pass
            finally:
                monkeypatch.setattr(Team, "run", original)
            for k in range(3):
                z = make_input(count, np.dtype(np.float64), "sum", comm.rank, seed=k)
                y = collectives.allreduce(z, algorithm=algorithm, options=options)
                assert np.allclose(y, reference_allreduce(z, "sum", comm), rtol=1e-12,
                                   atol=1e-12), (algorithm, options, count, k)


@pytest.mark.mpi(min_size=2)
def test_a_rank_that_never_arrives_makes_the_others_time_out():
    """Options.timeout in blocking calls: the last rank arrives late (after the others'
    deadline); the others raise TimeoutError naming the call instead of waiting for ever, and
    the late rank gets their notice when it arrives (or, if what it needed had been sent
    before the others gave up, returns the right result); the next call is right. (A
    communicator's first call, and an algorithm's first call on it, set up collectively
    without a deadline: docs/reliability.md.)"""
    import time

    comm = MPI.COMM_WORLD
    quick = collectives.Options(timeout=0.3)
    late = comm.rank == comm.size - 1
    algorithms = ("ring", "tree", "recursive_doubling", "native", "shm", "hierarchical")
    x = make_input(1001, np.dtype(np.float64), "sum", comm.rank)
    expected = reference_allreduce(x, "sum", comm)
    for algorithm in algorithms:  # set-up of each algorithm (collective, no deadline)
        collectives.allreduce(x, algorithm=algorithm)
    for algorithm in algorithms:
        comm.Barrier()
        if late:
            time.sleep(1.0)
        started = time.monotonic()
        try:
            y, error = collectives.allreduce(x, algorithm=algorithm, options=quick), None
        except TimeoutError as exc:
            y, error = None, exc
        if not late:
            assert error is not None, f"{algorithm}: no TimeoutError"
            assert time.monotonic() - started < 0.9, algorithm
        if error is not None:
            assert re.search(r"allreduce #\d+ (timed out after 0.3 s|failed on rank \d+: "
                             r"TimeoutError)", str(error)), str(error)
        else:
            assert np.allclose(y, expected, rtol=1e-12, atol=1e-12), algorithm
    comm.Barrier()
    _still_works()


@pytest.mark.mpi(min_size=2)
def test_validate_keeps_the_deadline_when_a_rank_never_arrives():
    """``validate=True``'s exchange of signatures runs under the call's guard: the last rank
    arrives late (after the others' deadline) and the others raise TimeoutError instead of
    waiting in the exchange for ever (before, an MPI allgather outside the deadline: a hang);
    the late rank gets their notice; the next call is right."""
    import time

    comm = MPI.COMM_WORLD
    quick = collectives.Options(timeout=0.3)
    late = comm.rank == comm.size - 1
    x = make_input(1001, np.dtype(np.float64), "sum", comm.rank)
    expected = reference_allreduce(x, "sum", comm)
    for algorithm in ("ring", "native", "shm"):
        collectives.allreduce(x, algorithm=algorithm)  # set-up (collective, no deadline)
        comm.Barrier()
        if late:
            time.sleep(1.0)
        started = time.monotonic()
        try:
            y, error = collectives.allreduce(x, algorithm=algorithm, options=quick,
                                             validate=True), None
        except TimeoutError as exc:
            y, error = None, exc
        if not late:
            assert error is not None, f"{algorithm}: no TimeoutError"
            assert time.monotonic() - started < 0.9, algorithm
            assert re.search(r"allreduce #\d+ timed out after 0.3 s", str(error)), str(error)
        elif error is None:
            assert np.allclose(y, expected, rtol=1e-12, atol=1e-12), algorithm
        y = collectives.allreduce(x, algorithm=algorithm, validate=True)
        assert np.allclose(y, expected, rtol=1e-12, atol=1e-12), algorithm
    comm.Barrier()
    _still_works()


@pytest.mark.mpi(min_size=2)
def test_validate_against_another_operation_fails_on_every_rank():
    """Rank 0 validates an allreduce while the others run a dissemination barrier, whose
    messages use the same communicator (a program whose ranks went different ways): a receive
    gets a message of another size, and every rank raises (before: rank 0 waited in an MPI
    allgather that no other rank would join, until the others' deadline and beyond)."""
    comm = MPI.COMM_WORLD
    collectives.barrier()
    collectives.allreduce(np.ones(3))
    with pytest.raises((ValueError, collectives.CollectiveError)):
        if comm.rank == 0:
            collectives.allreduce(np.ones(3), validate=True,
                                  options=collectives.Options(timeout=10))
        else:
            collectives.barrier(algorithm="dissemination",
                                options=collectives.Options(timeout=10))
    comm.Barrier()
    _still_works()


def test_two_phase_key_reused_with_a_new_size_raises_on_every_rank():
    """Issue 11, item 3: reusing a two_phase key with another tensor size raised "tensor
    changed size" on one rank and hung the others. Now every rank raises, and the key works
    again with its own size."""
    import compress
    comm = MPI.COMM_WORLD
    codec = compress.get("efsignsgd")
    collectives.compressed_allreduce(np.ones(8, np.float32), codec, strategy="two_phase", key="k")
    if comm.size > 1:
        error = _raises_everywhere(lambda: collectives.compressed_allreduce(
            np.ones(12, np.float32), codec, strategy="two_phase", key="k"))
        assert "use a distinct key per tensor" in str(error), str(error)
    y = collectives.compressed_allreduce(np.ones(8, np.float32), codec, strategy="two_phase",
                                         key="k")
    assert y.shape == (8,) and np.isfinite(y).all()
    _still_works()


def _accounted():
    """Stale messages the library has disposed of so far (see :func:`_reclaim`)."""
    from collectives._runtime import release
    from collectives._runtime.guard import DROPPED

    return DROPPED[0] + release.SWEPT[0]


def _reclaim(world, owed, since):
    """Receive the messages a test left queued on freed communicators (``owed`` on this rank),
    so that none can reach a later test's communicator: hold duplicates of ``world`` (each takes
    the lowest free context id) and take every message queued on them, until every rank has
    accounted for its own, counting those a guard dropped as an earlier incarnation's notice and
    those a release swept since ``since`` (:func:`_accounted`). Returns how many this rank
    accounted for."""
    from collectives._runtime import release

    deadline = time.monotonic() + 30
    while release.pending() and time.monotonic() < deadline:  # every rank is releasing
        release.progress()
    held, found, status = [], 0, MPI.Status()
    for _ in range(128):
        done = np.array([found + _accounted() - since >= owed], dtype=np.int32)
        world.Allreduce(MPI.IN_PLACE, done, op=MPI.LAND)
        if done[0]:
            break
        held.append(world.Dup())
        while (message := held[-1].Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)) is not None:
            message.Recv([np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8), MPI.BYTE])
            found += 1
    for comm in held:
        comm.Free()
    return found + _accounted() - since


def _notices_anywhere(world, dups=32):
    """How many notice-tagged messages wait on the ``dups`` lowest free context ids
    (duplicates of ``world`` held at once, each probed), summed over the ranks."""
    from collectives._runtime.guard import NOTICE_TAG

    held = [world.Dup() for _ in range(dups)]
    for _ in range(3):  # progress: what is on its way arrives
        world.Barrier()
    queued = np.array([sum(bool(c.Iprobe(MPI.ANY_SOURCE, NOTICE_TAG)) for c in held)])
    for comm in held:
        comm.Free()
    world.Allreduce(MPI.IN_PLACE, queued)
    return int(queued[0])


@pytest.mark.mpi(min_size=2)
def test_a_notice_to_a_rank_that_frees_the_communicator_is_received_first():
    """A failure's notice that reaches a rank after it withdrew its notice receive, or queues
    behind another, used to stay in MPI after the communicator was freed, for the next
    communicator MPI gave the same context id: a user's ``Dup`` receiving with tag 0, or
    mpi4py's allreduce of a Python object, which then failed with MPI_ERR_TRUNCATE (seen in a
    CI run: ``mpi_sgd.py``'s evaluation). A release now exchanges the notice counts and receives
    every notice before the communicator is freed (``_runtime/release.py``)."""
    from collectives._runtime import release
    from collectives._runtime.context import context

    world = MPI.COMM_WORLD
    for trial in range(3):
        comm = world.Dup()
        collectives.allreduce(np.ones(3), comm=comm, algorithm="ring")
        guard = context(comm).guard
        world.Barrier()  # every rank is done with the call: the notices are never read
        if comm.rank == 1:  # two notices to every other rank: the second queues behind the first
            for _ in range(2):
                guard._notify(RuntimeError(f"trial {trial}"))
        sent = guard.sent.copy()
        comm.Free()  # every rank, at once: nothing read the notices
        deadline = time.monotonic() + 30
        while release.pending() and time.monotonic() < deadline:
            release.progress()
        assert release.pending() == 0, "a release did not finish"
        assert sent.sum() == (2 * (world.size - 1) if world.rank == 1 else 0)
        assert _notices_anywhere(world) == 0, "a notice outlived its communicator"
        fresh = world.Dup()
        for _ in range(4):  # mpi4py's tag-0 point-to-point allreduce of a Python object
            assert fresh.allreduce(fresh.rank, op=MPI.SUM) == world.size * (world.size - 1) // 2
        fresh.Free()


def test_notice_left_on_a_freed_communicator_never_reaches_its_successor():
    """A notice that arrives for a communicator after its receiver freed it (sent outside the
    library here: a release receives every notice the library sends) stays queued in MPI; MPI
    may give the next communicator the same context id (MPICH takes the lowest free one). It
    used to retire native on that new communicator (and, abandoning a native operation that
    then completed, corrupt a result): now it is dropped there."""
    from collectives._runtime.context import context
    from collectives._runtime.guard import _HEAD, _NOTICE_BYTES, NOTICE_TAG

    world = MPI.COMM_WORLD
    owed, since = 0, _accounted()
    for trial in range(3):
        comm = world.Dup()
        collectives.allreduce(np.ones(3), comm=comm, algorithm="native")  # no window to free
        private, me, p = context(comm).comm, comm.rank, comm.size
        seq = context(comm).guard.seq
        if me != 0:
            comm.Free()  # its notice receive withdrawn (its release waits for rank 0's)
        world.Barrier()
        if me == 0:  # a late notice (of the call above) to every other rank
            box = np.zeros(_NOTICE_BYTES, dtype=np.uint8)
            box[:8 * _HEAD].view(np.int64)[:] = (seq, 0, 1, 0, 4)  # ValueError, 4 bytes
            box[8 * _HEAD:8 * _HEAD + 4] = np.frombuffer(b"late", dtype=np.uint8)
            MPI.Request.Waitall([private.Isend([box, MPI.BYTE], r, NOTICE_TAG)
                                 for r in range(1, p)])
            comm.Free()
        owed += me != 0
        world.Barrier()
        fresh = world.Dup() if trial % 2 else world.Split(color=0, key=-world.rank)
        x = make_input(7, np.dtype(np.int64), "sum", fresh.rank)
        ref = reference_allreduce(x, "sum", fresh)
        for algorithm in ("auto", "native", "auto", "native"):
            y = collectives.allreduce(x, algorithm=algorithm, comm=fresh)
            assert np.array_equal(y, ref), (trial, algorithm, y, ref)
        assert not context(fresh).guard.retired, "a stale notice retired native"
        fresh.Free()
    assert _reclaim(world, owed, since) == owed


@pytest.mark.mpi(min_size=2)
def test_a_notice_queued_on_a_freed_communicator_never_breaks_a_new_guard():
    """A notice-sized message left queued on a freed communicator waits in MPI for whatever
    communicator gets its context id next. A new guard agreed on its first call number with
    mpi4py's allreduce of a Python int, which sends point-to-point messages with tag 0 on a
    duplicate of its own: given that context id, it took the notice and failed (MPI_ERR_TRUNCATE,
    seen in a test run of mpi_hierarchical.py after this file). The agreement is an MPI
    collective now. The messages are taken back at the end: left queued, they broke a later
    test's mpi4py allreduce in the same job (mpi_sgd.py's, under a cold JIT cache)."""
    from collectives._runtime.context import context
    from collectives._runtime.guard import _NOTICE_BYTES, NOTICE_TAG

    world = MPI.COMM_WORLD
    owed, since = 0, _accounted()
    for trial in range(3):
        comm = world.Dup()
        context(comm)  # its private communicator, made now; its guard comes with the first call
        stale = world.Dup()  # freed with a notice-sized message to every rank but 1 queued
        box = np.zeros(_NOTICE_BYTES, dtype=np.uint8)
        reqs = [stale.Isend([box, MPI.BYTE], r, NOTICE_TAG)
                for r in range(stale.size) if stale.rank == 1 and r != 1]
        owed += world.rank != 1
        world.Barrier()
        MPI.Request.Waitall(reqs)
        world.Barrier()
        stale.Free()
        x = make_input(5, np.dtype(np.int64), "sum", comm.rank)
        y = collectives.allreduce(x, comm=comm, algorithm="ring")  # the guard is made here
        assert np.array_equal(y, reference_allreduce(x, "sum", comm)), trial
        comm.Free()
    assert _reclaim(world, owed, since) == owed


@pytest.mark.parametrize("piece", [0, 1, 2])
def test_abandoned_native_operation_never_writes_into_the_result(monkeypatch, piece):
    """A rank waiting in a native operation that learns of an older failure abandons it and
    runs the hand-written fallback; where every rank abandons it, the abandoned operations
    can still pair up and complete during the fallback. They used to write into the caller's
    result (x + 2 * other at p = 2): now MPI receives into a landing buffer of its own.
    ``piece``: the allreduce runs in pieces of 1000 bytes (algorithms/native.py) and the notice
    arrives in this one, so the fallback reduces the rest of the vector after pieces that
    native completed (and, in place, copied into x)."""
    from collectives._runtime.guard import _HEAD, _NOTICE_BYTES, NOTICE_TAG, Guard
    from collectives._runtime.context import context
    from collectives.algorithms import native as native_algorithm

    monkeypatch.setattr(native_algorithm, "LANDING_BYTES", 1000)
    original = Guard.complete
    sends = []
    seen = {}

    def complete(self, reqs, expect, peers, native=False, **kwargs):
        seen[self.seq] = seen.get(self.seq, -1) + native  # native operations of this call - 1
        if native and seen[self.seq] == piece:
            # an older failure's notice, from this rank to itself, arrives now
            box = np.zeros(_NOTICE_BYTES, dtype=np.uint8)
            box[:8 * _HEAD].view(np.int64)[:] = (self.seq - 1, self.rank, 1, 0, 4)
            box[8 * _HEAD:8 * _HEAD + 4] = np.frombuffer(b"test", dtype=np.uint8)
            sends.append((self.comm.Isend([box, MPI.BYTE], self.rank, NOTICE_TAG), box))
            while not self.notice.Get_status():  # arrived (before the operation can finish)
                pass
        return original(self, reqs, expect, peers, native=native, **kwargs)

    world = MPI.COMM_WORLD
    cases = [lambda x, c: collectives.allreduce(x, algorithm="native", comm=c),
             lambda x, c: collectives.allreduce(x, out=x, algorithm="native", comm=c),
             lambda x, c: collectives.allgather(x, algorithm="native", comm=c)]  # one operation
    for calls in cases[:2] if piece else cases:
        comm = world.Dup()
        x = make_input(1001, np.dtype(np.float64), "sum", comm.rank)
        expected = calls(x.copy(), comm).copy()
        monkeypatch.setattr(Guard, "complete", complete)
        first = calls(x.copy(), comm)  # abandoned native, fallback
        monkeypatch.setattr(Guard, "complete", original)
        assert context(comm).guard.retired or comm.size == 1
        again = calls(x.copy(), comm)  # native retired: hand-written
        for _ in range(3):  # progress for whatever is left in flight
            comm.Barrier()
        assert np.allclose(first, expected) and np.allclose(again, expected)
        assert_identical = gather_all(first, comm)
        assert (assert_identical == assert_identical[0]).all()
        comm.Free()
    MPI.Request.Waitall([s for s, _ in sends])


def _released(world):
    """Finish every release under way (collective: every rank is releasing)."""
    from collectives._runtime import release

    deadline = time.monotonic() + 30
    while release.pending() and time.monotonic() < deadline:
        release.progress()
    assert release.pending() == 0, "a release did not finish"
    world.Barrier()


@pytest.mark.world_sizes(3)
def test_collectives_that_went_different_ways_keep_their_communicator():
    """Rank 2 fails a reduce before any message; the root (rank 0) learns of it there and
    retires native, a leaf (rank 1) sends and returns. In the next native alltoall rank 1
    starts MPI's alltoall while ranks 0 and 2 run pairwise (rank 1 follows once it learns of
    the failure): every result is right, but rank 1's messages wait in the others' queues. The
    native duplicate is then parked on every rank, never freed before exit, so that no later
    communicator can get its context id and take them (``_runtime/release.py``, step 4; what
    that did: tests/test_recycled_context.py). After the same failure with no native call
    after it, every rank started the same operations, and the duplicates are freed."""
    from collectives._runtime import release

    world = MPI.COMM_WORLD
    r = world.rank
    for native_after in (True, False):
        comm = world.Dup()
        x = np.arange(12, dtype=np.float32) + 100 * r
        collectives.alltoall(x, algorithm="native", comm=comm)  # the signature agreed
        if r == 2:  # fails once rank 1, a leaf, has sent its part and returned
            world.recv(source=1, tag=7)
        bad = np.zeros(3, np.complex64) if r == 2 else np.zeros(3, np.float32)
        if r == 1:
            collectives.reduce(bad, root=0, algorithm="binomial", comm=comm)
            world.send(None, dest=2, tag=7)
        else:
            error = _raises_everywhere(lambda: collectives.reduce(
                bad, root=0, algorithm="binomial", comm=comm), TypeError)
            assert "unsupported dtype" in str(error), error
        y = collectives.alltoall(x, algorithm="native" if native_after else "pairwise",
                                 comm=comm)
        want = np.concatenate([np.arange(4 * r, 4 * r + 4) + 100 * k for k in range(3)])
        assert np.array_equal(y, want), (native_after, y)
        before = release.parked()
        comm.Free()
        _released(world)
        parked = world.allgather(release.parked() - before)
        assert parked == ([1] * 3 if native_after else [0] * 3), (native_after, parked)
    _still_works()


@pytest.mark.mpi(min_size=2)
def test_a_mismatch_or_a_failure_in_a_lane_raises_on_every_rank(monkeypatch):
    """Repeated shm calls run the kernel's entry (``shm.Lane``); its waits end as the
    dispatcher's do: an op that differs across ranks raises on every rank, and so does a rank
    that fails before its part (the others get its notice); the next calls are right."""
    from collectives._runtime.shmem.team import Team

    comm = MPI.COMM_WORLD
    last = comm.rank == comm.size - 1
    for count in (3, 100_000):  # both modes
        x = np.ones(count)
        y = np.empty_like(x)
        for op in ("sum", "max", "sum", "max"):  # a lane for each, on every rank
            collectives.allreduce(x, out=y, op=op)
        op = "max" if last else "sum"
        error = _raises_everywhere(lambda: collectives.allreduce(x, out=y, op=op))
        assert "the call differs (op or mode) across ranks" in str(error), str(error)
        collectives.reset(comm)  # native is retired after a failure; the lanes made anew
        for op in ("sum", "sum"):
            collectives.allreduce(x, out=y, op=op)
        original = Team.run_compiled

        def failing(self, *args):
            raise RuntimeError("injected")

        if comm.rank == 0:
            monkeypatch.setattr(Team, "run_compiled", failing)
        error = _raises_everywhere(lambda: collectives.allreduce(x, out=y),
                                   (RuntimeError, collectives.CollectiveError))
        assert "injected" in str(error), str(error)
        monkeypatch.setattr(Team, "run_compiled", original)
        for k in range(2):
            z = make_input(count, np.dtype(np.float64), "sum", comm.rank, seed=k)
            w = np.empty_like(z)
            for _ in range(2):
                collectives.allreduce(z, out=w)
                assert np.allclose(w, reference_allreduce(z, "sum", comm), rtol=1e-12,
                                   atol=1e-12), (count, k)
        collectives.reset(comm)
    _still_works()


@pytest.mark.mpi(min_size=2)
def test_a_notice_that_came_before_its_call_is_raised_by_a_shared_memory_wait(monkeypatch):
    """Rank 0, done with a call, fails the next one while rank 1 is still in the first: rank 1
    reads that notice early and keeps it for the call it names. Its shared-memory wait in that
    call must raise it. Only message waits looked at kept notices: the wait ran into its
    timeout here, or, without one, waited for ever."""
    from collectives._runtime.shmem.team import Team

    comm = MPI.COMM_WORLD
    original = Team.run

    def lingering(self, *args):  # rank 1: after its part, still in the call a while, polling
        original(self, *args)
        guard, end = args[5], time.monotonic() + 1.0
        while time.monotonic() < end:
            guard.poll()
            time.sleep(0.005)

    def failing(self, *args):
        raise RuntimeError("injected")

    quick = collectives.Options(timeout=20.0)
    x = np.ones(5)
    if comm.rank == 1:
        monkeypatch.setattr(Team, "run", lingering)
    collectives.allreduce(x, algorithm="shm", options=quick)
    monkeypatch.setattr(Team, "run", failing if comm.rank == 0 else original)
    error = _raises_everywhere(lambda: collectives.allreduce(x, algorithm="shm", options=quick),
                               (RuntimeError, collectives.CollectiveError, TimeoutError))
    monkeypatch.setattr(Team, "run", original)
    if comm.rank:
        assert isinstance(error, collectives.CollectiveError), repr(error)
        assert "failed on rank 0: RuntimeError: injected" in str(error), str(error)
    _still_works()
