"""collectives.torch's torch.distributed names (gather, scatter, send, recv, isend, irecv)
against the library's NumPy calls on the same values, on every rank (skipped without torch).

Every dtype of the tensors (bfloat16 compared by its bits), each root, blocking and
``async_op=True``, non-contiguous tensors; point-to-point rings against ``collectives.sendrecv``
of NumPy arrays; the errors, the same on every rank: a bad ``gather_list`` on the root only,
tensors that differ between ranks, a rank outside the group.
"""

import numpy as np
import pytest
from mpi4py import MPI

import collectives

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")
import collectives.torch as ct  # noqa: E402

# plumbing over gather, scatter and point-to-point, whose algorithms are checked at every size
# in mpi_alltoall.py and mpi_pt2pt.py: one rank, two and an odd number (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3)

torch.set_num_threads(1)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8]


def _bits(t):
    """A tensor's bytes as NumPy (bfloat16 as int16: the library's NumPy calls move bytes)."""
    t = t.detach().contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def _tensor(dtype, shape, rank, salt=0):
    g = torch.Generator().manual_seed(100 * salt + rank)
    n = int(np.prod(shape))
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype).reshape(shape)
    return torch.randint(0, 100, (n,), generator=g).to(dtype).reshape(shape)


def test_gather_and_scatter_equal_the_numpy_calls(comm):
    """Every dtype, every root, blocking and async_op=True (one item per communicator: the
    cost of a test item is most of a call's)."""
    for dtype in DTYPES:
        for async_op in (False, True):
            _gather_and_scatter(dtype, async_op, comm)


def _gather_and_scatter(dtype, async_op, comm):
    p, r = comm.size, comm.rank
    for root in range(p):
        x = _tensor(dtype, (2, 3), r, root)
        gather_list = [torch.empty(2, 3, dtype=dtype) for _ in range(p)] if r == root else None
        work = ct.gather(x, gather_list, dst=root, async_op=async_op, comm=comm)
        assert (work is not None) == async_op
        if work is not None:
            assert work.wait() is True and work.is_completed()
        ref = collectives.gather(_bits(x), root=root, comm=comm)
        if r == root:
            got = np.concatenate([_bits(g).reshape(-1) for g in gather_list])
            assert got.tobytes() == ref.tobytes()
        # scatter: the root's list, block rank into every rank's tensor (a transposed one too)
        parts = [_tensor(dtype, (3, 2), j, root + 7) for j in range(p)] if r == root else None
        out = torch.zeros(2, 3, dtype=dtype).t()  # not contiguous: received, then copied in
        work = ct.scatter(out, parts, src=root, async_op=async_op, comm=comm)
        if work is not None:
            work.wait()
        whole = np.concatenate([_bits(t).reshape(-1) for t in parts]) if r == root else None
        block = np.empty(6, _bits(out).dtype)
        collectives.scatter(whole, root=root, out=block, comm=comm)
        assert _bits(out).reshape(-1).tobytes() == block.tobytes()


def test_point_to_point_ring_equals_numpy_sendrecv(comm):
    """A ring shift with isend/recv and with isend/irecv equals collectives.sendrecv of the same
    values as NumPy; recv returns the sender, ``src=None`` takes any sender."""
    for dtype in DTYPES:
        _ring(dtype, comm)


def _ring(dtype, comm):
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    x = _tensor(dtype, (4, 5), r)
    ref = np.empty_like(_bits(x))
    collectives.sendrecv(_bits(x), right, ref, left, sendtag=3, recvtag=3, comm=comm)
    y = torch.zeros(4, 5, dtype=dtype)
    work = ct.isend(x, right, tag=3, comm=comm)
    assert ct.recv(y, left, tag=3, comm=comm) == left
    work.wait()
    assert _bits(y).tobytes() == ref.tobytes()
    z = torch.zeros(5, 4, dtype=dtype).t()  # not contiguous: received, then copied in
    work = ct.irecv(z, None, tag=4, comm=comm)
    send = ct.isend(x, right, tag=4, comm=comm)
    work.wait()
    send.wait()
    assert work.source_rank() == left and _bits(z).tobytes() == ref.tobytes()


@pytest.mark.mpi(min_size=2)
def test_send_recv_on_the_global_group_and_blocking_send():
    comm = MPI.COMM_WORLD
    x = torch.arange(6, dtype=torch.float32) + comm.rank
    if comm.rank == 0:
        ct.send(x, 1, tag=9)
    elif comm.rank == 1:
        y = torch.empty(6)
        assert ct.recv(y, tag=9) == 0 and torch.equal(y, torch.arange(6, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"send: dst=99 is not a rank of the group"):
        ct.send(x, 99)


def test_errors_on_every_rank(comm):
    """A gather_list of the wrong length on the root, tensors that differ between ranks, a root
    outside the group: the same ValueError on every rank, before any data moves; the next call
    works."""
    p, r = comm.size, comm.rank
    x = torch.ones(3)
    bad = [torch.empty(3)] * (p + 1) if r == 0 else None
    with pytest.raises(ValueError, match="gather: invalid arguments on rank 0: gather: "
                                         f"gather_list must be a list of {p} tensors"):
        ct.gather(x, bad, dst=0, comm=comm)
    if p > 1:
        with pytest.raises(ValueError, match=r"scatter: arguments differ across ranks \(shape: "
                                             r"rank 0: \(3,\), rank 1: \(4,\)"):
            ct.scatter(torch.ones(3 + r), [torch.ones(3)] * p if r == 0 else None, comm=comm)
    with pytest.raises(ValueError, match="gather: dst"):
        ct.gather(x, None, dst=p, comm=comm)
    parts = [torch.full((3,), float(j)) for j in range(p)] if r == 0 else None
    ct.scatter(x, parts, src=0, comm=comm)
    assert torch.equal(x, torch.full((3,), float(r)))
