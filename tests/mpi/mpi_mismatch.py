"""The MPI library's own collectives ("native") with arguments that differ across ranks.

MPI leaves a collective whose ranks pass different counts, dtypes or ops undefined (MPICH
returns a wrong answer, silently). ``algorithm="native"`` of every public collective checks the
signature across ranks whenever it is not the one agreed on last (``_runtime/agree.py``): a
mismatch is the same ``ValueError`` on every rank, naming each rank's values, and the caller's
arrays are left alone; a rank that changes its arguments while another repeats a remembered call
ends in a ``ValueError`` on every rank (the checking rank's check note, ``_runtime/guard.py``),
without a timeout, never a wrong answer or a hang.
"""

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from reference import make_input, reference_allreduce

#: every test needs a rank to differ from; the check is an allgather of signatures, whose
#: properties ("on every rank", the first or last rank odd) 2, 3 and 4 ranks cover (the native
#: algorithms' results at every size are mpi_allreduce.py's)
pytestmark = [pytest.mark.world_sizes(2, 3, 4), pytest.mark.mpi(min_size=2)]

SENTINEL = -7.0
#: Options.timeout of the tests that wait for one: short, yet long enough that a rank of a
#: loaded machine (more ranks than cores) does not miss the calls before it
TIMEOUT_S = 2.0
#: per collective, the call with algorithm="native" on x (1-D), out filled with SENTINEL
CALLS = {
    "allreduce": lambda x, out, **kw: collectives.allreduce(x, out=out, **kw),
    "reduce_scatter": lambda x, out, **kw: collectives.reduce_scatter(x, **kw),
    "allgather": lambda x, out, **kw: collectives.allgather(x, **kw),
    "bcast": lambda x, out, **kw: collectives.bcast(x, **kw),
    "reduce": lambda x, out, **kw: collectives.reduce(x, out=out, **kw),
}
#: which fields each collective has (op: the reducing ones; root: bcast and reduce)
FIELDS = {"allreduce": ("count", "dtype", "op"), "reduce_scatter": ("count", "dtype", "op"),
          "allgather": ("count", "dtype"), "bcast": ("count", "dtype", "root"),
          "reduce": ("count", "dtype", "op", "root")}
CASES = [(name, field) for name, fields in FIELDS.items() for field in (*fields, "same-bytes")]


def _arguments(field, odd, p):
    """(count, dtype, op, root) of a rank: ``odd`` for the one rank that differs; "same-bytes":
    another dtype of the same size (MPI would read the bytes as the other type)."""
    count = 2 * p + 3 + (field == "count" and odd)
    dtype = np.dtype(np.float32)
    if field == "dtype" and odd:
        dtype = np.dtype(np.float64)
    if field == "same-bytes" and odd:
        dtype = np.dtype(np.int32)
    op = "max" if field == "op" and odd else "sum"
    root = p - 1 if field == "root" and odd else 0
    return count, dtype, op, root


def _value(field, count, dtype, op, root):
    return {"count": count, "dtype": dtype, "same-bytes": dtype, "op": op, "root": root}[field]


@pytest.mark.parametrize("odd_rank", ["first", "last"])
@pytest.mark.parametrize("name,field", CASES)
def test_native_mismatch_raises_on_every_rank(name, field, odd_rank):
    comm = MPI.COMM_WORLD
    p = comm.size
    odd = (comm.rank == 0) if odd_rank == "first" else (comm.rank == p - 1)
    count, dtype, op, root = _arguments(field, odd, p)
    x = np.ones(count, dtype)
    out = np.full(count, SENTINEL, dtype)
    kw = {"algorithm": "native"}
    if "op" in FIELDS[name]:
        kw["op"] = op
    if "root" in FIELDS[name]:
        kw["root"] = root
    with pytest.raises(ValueError) as info:
        CALLS[name](x, out, **kw)
    message = str(info.value)
    everyone = comm.allgather((count, dtype, op, root))
    shown = "dtype" if field == "same-bytes" else field
    values = ", ".join(f"rank {r}: {_value(field, *a)}" for r, a in enumerate(everyone))
    if name == "allgather" and field == "count":  # its blocks' counts, one per rank
        shown = "counts"
        values = ", ".join(f"rank {r}: {(a[0],) * p}" for r, a in enumerate(everyone))
    assert message.startswith(f"{name}: arguments differ across ranks ("), message
    assert f"{shown}: {values}" in message, message
    messages = comm.allgather(message)
    assert all(m == messages[0] for m in messages), "ranks raised different errors"
    # no wrong answer: nothing was written (bcast's x and the results stay as they were)
    assert (out == SENTINEL).all() and (x == 1).all(), (out, x)
    _native_still_works()


#: the same calls through the progress engine (the non-blocking forms), waited for at once
ICALLS = {
    "allreduce": lambda x, out, **kw: collectives.iallreduce(x, out=out, **kw).wait(),
    "reduce_scatter": lambda x, out, **kw: collectives.ireduce_scatter(x, **kw).wait(),
    "allgather": lambda x, out, **kw: collectives.iallgather(x, **kw).wait(),
    "bcast": lambda x, out, **kw: collectives.ibcast(x, **kw).wait(),
    "reduce": lambda x, out, **kw: collectives.ireduce(x, out=out, **kw).wait(),
}


@pytest.mark.parametrize("name,field", [c for c in CASES if c[1] in ("count", "dtype")])
def test_native_mismatch_raises_on_every_rank_through_the_engine(name, field):
    """The non-blocking forms' native operations run on the engine's context, which has a
    control communicator of its own for the signature check: a count or dtype that differs is
    the same ValueError on every rank there too (it was a silent wrong answer: rank 0's 10
    elements summed with rank 1's first 10 of 11), nothing written. (An engine whose operation
    failed refuses later ones on its communicator: the test uses one of its own.)"""
    comm = MPI.COMM_WORLD.Dup()
    p = comm.size
    count, dtype, op, root = _arguments(field, comm.rank == p - 1, p)
    x = np.ones(count, dtype)
    out = np.full(count, SENTINEL, dtype)
    with pytest.raises(ValueError, match=rf"^{name}: arguments differ across ranks") as info:
        ICALLS[name](x, out, algorithm="native", comm=comm)
    messages = comm.allgather(str(info.value))
    assert all(m == messages[0] for m in messages), "ranks raised different errors"
    assert (out == SENTINEL).all() and (x == 1).all(), (out, x)
    comm.Free()
    same = collectives.iallreduce(np.full(3, 1.0), algorithm="native").wait()  # agreed: runs
    assert np.array_equal(same, np.full(3, float(p)))


def _native_still_works(comm=MPI.COMM_WORLD):
    """Right answers from every native collective after the error; native was not retired (an
    error every rank reached together sends no notice)."""
    from collectives._runtime.context import context

    assert not context(comm).guard.retired
    x = make_input(2 * comm.size + 1, np.dtype(np.float64), "sum", comm.rank)
    expected = reference_allreduce(x, "sum", comm)
    assert np.allclose(collectives.allreduce(x, algorithm="native"), expected, rtol=1e-12)
    assert np.allclose(collectives.reduce_scatter(np.ones(comm.size), algorithm="native"),
                       [float(comm.size)])
    assert np.array_equal(collectives.allgather(np.full(2, comm.rank), algorithm="native"),
                          np.repeat(np.arange(comm.size), 2))
    b = np.full(3, float(comm.rank))
    assert np.array_equal(collectives.bcast(b, algorithm="native"), np.zeros(3))
    y = collectives.reduce(x, algorithm="native")
    if comm.rank == 0:
        assert np.allclose(y, expected, rtol=1e-12)


def _raises_changed(call):
    """Run ``call`` on every rank, without a timeout: it must raise the ValueError of a rank
    that repeats while another checks (its own or, through its notice, another rank's)."""
    with pytest.raises(ValueError, match="passes other arguments than the ones every rank "
                                         "agreed on last"):
        call()


def test_a_rank_that_changes_its_array_while_another_repeats():
    """Every rank repeats ``allreduce(x, out=y, algorithm="native")`` (remembered: its lane
    runs with no check), then the last rank passes an array of another count while the others
    repeat: the last rank checks the new signature while the others run MPI's allreduce, on
    other communicators; its check note makes the repeaters raise, and their notice the last
    rank: ValueError on every rank, no timeout set, never a truncated result; the repeaters'
    ``y`` keeps its last result."""
    comm = MPI.COMM_WORLD
    last = comm.rank == comm.size - 1
    x = make_input(10, np.dtype(np.float32), "sum", comm.rank)
    y = np.empty_like(x)
    for _ in range(3):
        collectives.allreduce(x, out=y, algorithm="native")
    assert np.allclose(y, reference_allreduce(x, "sum", comm), rtol=1e-6)
    before = y.copy()
    z = np.ones(11, np.float32)
    w = np.full(11, SENTINEL, np.float32)
    if last:
        _raises_changed(lambda: collectives.allreduce(z, out=w, algorithm="native"))
        assert (w == SENTINEL).all(), w
    else:
        _raises_changed(lambda: collectives.allreduce(x, out=y, algorithm="native"))
        assert np.array_equal(y, before), y
    collectives.reset(comm)  # native is retired after a failure
    _native_still_works()


@pytest.mark.parametrize("late", [False, True], ids=["together", "repeaters-late"])
def test_ranks_that_repeat_two_different_remembered_calls(late):
    """Both calls remembered on every rank (a loop over two arrays of different counts); then
    the last rank repeats the second while the others repeat the first: only the signature
    agreed on last runs without a check, so the last rank skips while the others check:
    ValueError on every rank, whether the note reaches the last rank in its wait or before
    (``late``: the last rank arrives after the note)."""
    comm = MPI.COMM_WORLD
    a, b = np.ones(10, np.float32), np.ones(11, np.float32)
    ya, yb = np.empty_like(a), np.empty_like(b)
    for _ in range(2):
        collectives.allreduce(a, out=ya, algorithm="native")
        collectives.allreduce(b, out=yb, algorithm="native")
    assert (ya == comm.size).all() and (yb == comm.size).all()
    ya[:], yb[:] = SENTINEL, SENTINEL
    if comm.rank == comm.size - 1:
        if late:
            time.sleep(0.2)  # past the checkers' patience: their notes wait for this rank
        _raises_changed(lambda: collectives.allreduce(b, out=yb, algorithm="native"))
    else:
        _raises_changed(lambda: collectives.allreduce(a, out=ya, algorithm="native"))
    assert (ya == SENTINEL).all() and (yb == SENTINEL).all(), (ya, yb)
    collectives.reset(comm)
    _native_still_works()


def test_a_slow_check_that_every_rank_makes_is_no_mismatch():
    """A check that one rank joins late (past the others' patience: they send check notes)
    while a signature was agreed, then a repeat of the new one: the notes name a check every
    rank made, so nothing is raised, and the results are right."""
    comm = MPI.COMM_WORLD
    a, b = np.ones(10, np.float32), np.ones(11, np.float32)
    ya, yb = np.empty_like(a), np.empty_like(b)
    collectives.allreduce(a, out=ya, algorithm="native")
    if comm.rank == 0:
        time.sleep(0.2)
    for _ in range(3):
        collectives.allreduce(b, out=yb, algorithm="native")
        assert (yb == comm.size).all(), yb
    collectives.allreduce(a, out=ya, algorithm="native")
    assert (ya == comm.size).all(), ya


def test_a_repeat_after_a_mismatch_is_checked_again():
    """A mismatch (every rank checking: a new array everywhere) clears the agreed signature on
    every rank: the next call, a repeat of a remembered call on every rank, checks again and is
    right."""
    comm = MPI.COMM_WORLD
    x = np.ones(6)
    y = np.empty_like(x)
    collectives.allreduce(x, out=y, algorithm="native")
    collectives.allreduce(x, out=y, algorithm="native")
    z = np.ones(7)
    with pytest.raises(ValueError, match=r"op: rank 0: (max|sum)"):
        collectives.allreduce(z, out=z, algorithm="native",
                              op="max" if comm.rank == 1 else "sum")
    from collectives._runtime.context import context

    assert context(comm).agreed is None
    y[:] = 0
    collectives.allreduce(x, out=y, algorithm="native")
    assert (y == comm.size).all(), y
    assert context(comm).agreed is not None


@pytest.mark.world_sizes(4, 5)
def test_hierarchical_native_across_nodes_with_other_counts_raises_on_every_rank():
    """hierarchical with native between nodes: emulated nodes of two ranks whose ranks pass
    10 and 11 elements. The node leaders' native allreduce across nodes checks its signature on
    the cross-node context's control communicator: a ValueError on every rank, the ranks that
    did not take part in that check told by the guard (they ran a position whose blocks agreed;
    before, ranks 2 and 3 got a wrong element, silently)."""
    comm = MPI.COMM_WORLD.Dup()
    x = np.ones(10 if comm.rank < 2 else 11, np.float32)
    options = collectives.Options(node_size=2, inter_algorithm="native", timeout=10 * TIMEOUT_S)
    with pytest.raises(ValueError, match="arguments differ across ranks"):
        collectives.allreduce(x, algorithm="hierarchical", comm=comm, options=options)
    comm.Free()
