"""Point-to-point messages (``send``, ``recv``, ``sendrecv``, ``isend``, ``irecv``): ring exchanges
of every kind of array, a message that does not fit its receive, a receive that never gets one.

Rings need two ranks and gain nothing new past five (an odd ring, more ranks than cores); the
error paths need a pair.
"""

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives

pytestmark = pytest.mark.world_sizes(2, 3, 4, 5)

try:
    import ml_dtypes
    BF16 = [np.dtype(ml_dtypes.bfloat16)]
except ImportError:  # bfloat16 is then not tested here
    BF16 = []

DTYPES = [np.dtype(d) for d in ("float32", "float64", "float16", "int8", "uint64")] + BF16
COUNTS = (0, 1, 1001, 40_001)  # 40_001 float64: above MPICH's eager limit (a rendezvous)
SHORT = collectives.Options(timeout=30.0)  # a hang fails the test instead of the job


def _array(count, dtype, rank):
    """Values that name the rank and the element (exact in every dtype at these counts)."""
    return (np.arange(count) % 50 + 3 * rank).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ring(comm, dtype):
    """Every rank's array reaches the next rank by each form: the blocking pair (rank 0 sends
    first, the others receive first; not to itself, which MPI_Send cannot do for a large
    message either), sendrecv, and isend/irecv. On COMM_WORLD, a split communicator (ranks
    reversed) and COMM_SELF (a ring of one)."""
    r, p = comm.rank, comm.size
    nxt, prev = (r + 1) % p, (r - 1) % p
    for count in COUNTS:
        x, want = _array(count, dtype, r), _array(count, dtype, prev)
        out = np.full(count, 99, dtype)
        if p > 1:
            if r == 0:
                collectives.send(x, nxt, tag=1, comm=comm)
                assert collectives.recv(out, prev, tag=1, comm=comm) is out
            else:
                collectives.recv(out, prev, tag=1, comm=comm, options=SHORT)
                collectives.send(x, nxt, tag=1, comm=comm, options=SHORT)
            assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), (count, "send/recv")
            out[...] = 99
        assert collectives.sendrecv(x, nxt, out, prev, sendtag=2, recvtag=2, comm=comm) is out
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), (count, "sendrecv")
        out[...] = 99
        rreq = collectives.irecv(out, prev, tag=3, comm=comm)
        sreq = collectives.isend(x, nxt, tag=3, comm=comm)
        assert rreq.wait() is out and sreq.wait() is None and rreq.test()
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), (count, "isend/irecv")


def test_persistent_plans_send_what_the_array_holds_at_each_call():
    """send_init/recv_init check once; each plan() moves the array's current values, and a
    receive plan reports a mismatch as recv does."""
    comm = MPI.COMM_WORLD
    r, p = comm.rank, comm.size
    x, out = np.zeros(70_000, np.float32), np.empty(70_000, np.float32)
    send = collectives.send_init(x, (r + 1) % p, tag=8, options=SHORT)
    recv = collectives.recv_init(out, (r - 1) % p, tag=8, options=SHORT)
    for step in range(3):
        x[...] = 10 * step + r
        if r == 0:
            send()
            assert recv() is out
        else:
            recv()
            send()
        assert np.all(out == 10 * step + (r - 1) % p)
    if r == 0:
        collectives.send(np.ones(3), 1 % p, tag=9)
    if r == 1 % p:
        with pytest.raises(ValueError, match="3 elements of float64"):
            collectives.recv_init(np.empty(3, np.float32), 0, tag=9, options=SHORT)()
    with pytest.raises(ValueError, match="dest must be"):
        collectives.send_init(x, p)


@pytest.mark.world_sizes(2, 3)
def test_repeated_messages_are_remembered_and_checked_again(monkeypatch):
    """A ``send``/``recv`` repeated on the same arrays runs from the one cache of remembered
    calls without the first call's checks (``prepare_local`` counted); what can change in place
    is checked again: an ``out`` made read-only is an error before any message is taken (the
    message waits for the next receive), and a freed communicator is no communicator."""
    from collectives.pt2pt import messages

    checked = []
    prepare = messages.prepare_local
    monkeypatch.setattr(messages, "prepare_local",
                        lambda cls, *a: checked.append(cls.kind) or prepare(cls, *a))
    comm = MPI.COMM_WORLD
    r = comm.rank
    dup = comm.Dup()
    x = np.zeros(1000, np.float32)
    out = np.empty_like(x)
    for step in range(4):
        if r == 0:
            x[:] = step
            collectives.send(x, 1, tag=5, comm=dup)
        elif r == 1:
            assert collectives.recv(out, 0, tag=5, comm=dup) is out
            assert np.array_equal(out, np.full(1000, step, np.float32)), step
    assert checked == {0: ["send"], 1: ["recv"]}.get(r, []), checked
    if r == 0:
        x[:] = 7
        collectives.send(x, 1, tag=5, comm=dup)
    elif r == 1:
        out.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            collectives.recv(out, 0, tag=5, comm=dup)
        out.flags.writeable = True
        collectives.recv(out, 0, tag=5, comm=dup)
        assert np.array_equal(out, np.full(1000, 7, np.float32))
    dup.Free()
    if r < 2:
        with pytest.raises(TypeError, match="intracommunicator"):
            if r == 0:
                collectives.send(x, 1, tag=5, comm=dup)
            else:
                collectives.recv(out, 0, tag=5, comm=dup)


def test_tensors_and_shapes():
    """Tensors (bfloat16 and float32) and a 2-D Fortran-order array go as their bytes."""
    torch = pytest.importorskip("torch")
    comm = MPI.COMM_WORLD
    r, p = comm.rank, comm.size
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.arange(33, dtype=dtype) + r
        out = torch.zeros(33, dtype=dtype)
        assert collectives.sendrecv(x, (r + 1) % p, out, (r - 1) % p) is out
        assert torch.equal(out, torch.arange(33, dtype=dtype) + (r - 1) % p)
    x = np.asfortranarray(np.arange(12.0).reshape(3, 4) + r)
    out = np.zeros((3, 4), order="F")
    collectives.sendrecv(x, (r + 1) % p, out, (r - 1) % p)
    assert np.array_equal(out, np.arange(12.0).reshape(3, 4) + (r - 1) % p)


def test_any_source_any_tag_and_status():
    """Rank 0 takes every other rank's message, in whatever order, with its source and tag."""
    comm = MPI.COMM_WORLD
    r, p = comm.rank, comm.size
    if r:
        collectives.send(np.full(5, r, np.int32), 0, tag=10 + r)
    else:
        seen = set()
        for _ in range(p - 1):
            status = MPI.Status()
            out = collectives.recv(np.empty(5, np.int32), MPI.ANY_SOURCE, tag=MPI.ANY_TAG,
                                   status=status)
            assert status.tag == 10 + status.source and np.all(out == status.source)
            assert status.Get_count(MPI.BYTE) == 20
            seen.add(status.source)
        assert seen == set(range(1, p))
    out = np.full(3, 7.0)
    collectives.sendrecv(np.ones(3), MPI.PROC_NULL, out, MPI.PROC_NULL)  # no message: out kept
    assert np.all(out == 7.0)


MISMATCHES = {  # what rank 0 sends, what rank 1 receives into, the error's words
    "longer": (np.ones(9, np.float32), np.empty(8, np.float32), "9 elements of float32"),
    "shorter": (np.ones(7, np.float32), np.empty(8, np.float32), "7 elements of float32"),
    "dtype": (np.ones(8, np.int32), np.empty(8, np.float32), "8 elements of int32"),
    "16-bit types": (np.ones(8, np.uint16), np.empty(8, np.float16),
                           "8 elements of uint16"),
    "large dtype": (np.ones(50_000, np.float64), np.empty(100_000, np.float32),
                    "50000 elements of float64"),
    "large shorter": (np.ones(9_000, np.float64), np.empty(10_000, np.float64),
                      "9000 elements of float64"),
    "large longer": (np.ones(20_000, np.float64), np.empty(10_000, np.float64),
                     "20000 elements of float64"),
}


@pytest.mark.world_sizes(1, 2)
@pytest.mark.parametrize("nbytes", [32, 1 << 17])
def test_a_message_to_oneself_received_by_a_request_posted_first(nbytes):
    """MPI completes a send to oneself only once a receive takes it: ``irecv`` first, then
    ``isend(...).wait()``, then the receive's ``wait()``, small and large (docs/pt2pt.md)."""
    comm = MPI.COMM_WORLD
    x = np.arange(nbytes // 8, dtype=np.float64) + comm.rank
    y = np.zeros_like(x)
    req = collectives.irecv(y, comm.rank, tag=5)
    collectives.isend(x, comm.rank, tag=5).wait()
    req.wait()
    assert np.array_equal(y, x)


@pytest.mark.world_sizes(2, 3)
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatch_is_an_error_on_the_receiver(case):
    """A message of another count or dtype raises ValueError on the receiver, which still takes
    it (into a buffer of its own: out is untouched), so the sender completes; the pair then exchanges correctly (nothing left in flight)."""
    comm = MPI.COMM_WORLD
    x, out, words = MISMATCHES[case]
    if comm.rank == 0:
        collectives.send(x, 1, tag=4, options=SHORT)
    elif comm.rank == 1:
        out[...] = 0
        with pytest.raises(ValueError, match="does not fit out") as info:
            collectives.recv(out, 0, tag=4, options=SHORT)
        assert words in str(info.value) and "rank 0" in str(info.value)
        assert not out.any()  # left as it was
    if comm.rank < 2:
        got = collectives.sendrecv(np.arange(4.0) + comm.rank, 1 - comm.rank, np.empty(4),
                                   1 - comm.rank, sendtag=4, recvtag=4, options=SHORT)
        assert np.array_equal(got, np.arange(4.0) + 1 - comm.rank)
    comm.Barrier()


@pytest.mark.world_sizes(2)
@pytest.mark.parametrize("sent, words", [(np.ones(20_000), "more elements of float64"),
                                         (np.ones(9_000), "9000 elements of float64"),
                                         (np.ones(10_000, np.int64), "10000 elements of int64")])
def test_mismatch_in_a_large_sendrecv(sent, words):
    """A large receive beside a send is posted into out before its message comes: a longer
    message is MPI's truncation error, a shorter one a short count, another dtype is found by
    a look; each a ValueError, and each rank's send completes."""
    comm = MPI.COMM_WORLD
    x = sent if comm.rank == 0 else np.ones(10_000)
    out = np.empty(10_000)
    if comm.rank == 1:
        with pytest.raises(ValueError, match=words):
            collectives.sendrecv(x, 0, out, 0, options=SHORT)
    else:
        collectives.sendrecv(x, 1, out, 1, options=SHORT)


@pytest.mark.world_sizes(2)
def test_mismatch_posted_before_the_message():
    """The receive waits first, then a message of another dtype comes: found while waiting."""
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        comm.Barrier()
        collectives.send(np.ones(6, np.float64), 1, tag=6)
    else:
        req = collectives.irecv(np.empty(6, np.int64), 0, tag=6)
        assert not req.test()
        comm.Barrier()
        with pytest.raises(ValueError, match="6 elements of float64"):
            req.wait(timeout=30.0)


@pytest.mark.world_sizes(2)
def test_a_blocking_receive_finds_another_dtype_while_it_waits():
    """A blocking receive without a timeout that waits first (its probes, then its yields),
    then gets a message of another dtype: found by a look, a ValueError; then one that fits."""
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        time.sleep(0.05)  # the receive is yielding by now
        collectives.send(np.ones(6, np.float64), 1, tag=6)
        comm.Barrier()
        collectives.send(np.arange(6), 1, tag=6)
    else:
        out = np.zeros(6, np.int64)
        with pytest.raises(ValueError, match="6 elements of float64"):
            collectives.recv(out, 0, tag=6)
        assert not out.any()
        comm.Barrier()
        assert np.array_equal(collectives.recv(out, 0, tag=6), np.arange(6))


@pytest.mark.world_sizes(2)
def test_no_sender_times_out():
    """A receive no rank sends to, and a large send no rank receives, raise TimeoutError after
    Options.timeout; both are withdrawn, and the next exchange is unaffected."""
    comm = MPI.COMM_WORLD
    quick = collectives.Options(timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="Options.timeout"):
        collectives.recv(np.empty(4), 1 - comm.rank, tag=77, options=quick)
    assert time.monotonic() - t0 < 5
    if comm.rank == 0:  # rendezvous size: it waits for a receive that never comes
        with pytest.raises(TimeoutError, match="has not received it"):
            collectives.send(np.ones(1 << 18), 1, tag=78, options=quick)
    comm.Barrier()
    if comm.rank == 1:  # a send MPI could not withdraw (MPICH's) is still delivered
        req = collectives.irecv(np.empty(1 << 18), 0, tag=78)
        try:
            assert np.all(req.wait(timeout=1.0) == 1.0)
        except TimeoutError:  # withdrawn (a library that can cancel a send)
            pass
    comm.Barrier()
    req = collectives.irecv(np.empty(2), 1 - comm.rank, tag=79)
    with pytest.raises(TimeoutError):
        req.wait(timeout=0.1)
    comm.Barrier()
    collectives.send(np.full(2, 5.0), 1 - comm.rank, tag=79)  # the request is still in flight
    assert np.all(req.wait() == 5.0)
    comm.Barrier()


BAD = [
    (lambda: collectives.send(np.ones(2), MPI.COMM_WORLD.size), ValueError, "dest must be a rank"),
    (lambda: collectives.send(np.ones(2), 0, tag=-1), ValueError, "tag must be an int"),
    (lambda: collectives.send(np.ones(2), 0, tag=MPI.ANY_TAG), ValueError, "tag must be"),
    (lambda: collectives.send(np.ones(2), 0, tag=2**40), ValueError, "tag must be"),
    (lambda: collectives.send(np.ones(2, bool), 0), TypeError, "send: x has unsupported dtype"),
    (lambda: collectives.send(np.ones(4)[::2], 0), ValueError, "contiguous"),
    (lambda: collectives.recv(np.ones(2), MPI.ANY_TAG - 5), ValueError, "source must be"),
    (lambda: collectives.recv(np.ones(2).setflags(write=False) or None, 0), TypeError,
     "out must be"),
    (lambda: collectives.recv(np.frombuffer(b"abcdefgh", np.uint8), 0), ValueError, "read-only"),
    (lambda: collectives.recv(np.ones(2), 0, status="s"), TypeError, "MPI.Status"),
    (lambda: (lambda a: collectives.sendrecv(a[:4], 0, a[2:6], 0))(np.ones(8)), ValueError,
     "overlaps"),
    (lambda: collectives.send(np.ones(2), 0, options={"timeout": 1}), TypeError, "Options"),
]


@pytest.mark.world_sizes(2)
@pytest.mark.parametrize("i", range(len(BAD)))
def test_bad_arguments_raise_before_any_message(i):
    fn, kind, words = BAD[i]
    with pytest.raises(kind, match=words):
        fn()
    status = MPI.Status()  # nothing was sent
    assert not MPI.COMM_WORLD.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
