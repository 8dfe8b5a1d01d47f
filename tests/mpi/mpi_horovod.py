"""Horovod's torch surface (``import collectives.torch as hvd``) against the library's own calls.

A Horovod-style training script (horovod_mnist.py) runs with only its import changed and ends
with the same parameters on every rank; then each Horovod name is called once and compared with
the native equivalent: allreduce with its ops and scale factors against ``collectives.allreduce``,
allgather of different first dimensions against ``torch.cat`` of ``comm.allgather``, broadcast,
reducescatter's rows, grouped and async forms with handles, autograd through allreduce, allgather
and broadcast, process sets against ``comm.Split``, join, object collectives, the build
questions, Compression's compressors, and the errors Horovod's tests expect (a shape mismatch
raises HorovodInternalError, a RuntimeError, on every rank; Adasum is refused). The async calls
are matched by name in the background, as Horovod's coordinator matches them: named calls in
different orders on different ranks, a second call with a pending name (ValueError at once), a
call that returns before the other ranks submit theirs, and join's zeros in named allreduces. Horovod's own
test file, run against this package, is in docs/pytorch.md.
"""

import runpy
import time
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import collectives

torch = pytest.importorskip("torch")
import collectives.torch as hvd  # noqa: E402

pytestmark = pytest.mark.world_sizes(1, 2, 4)
torch.set_num_threads(1)
SCRIPT = Path(__file__).with_name("horovod_mnist.py")


@pytest.mark.world_sizes(2, 4)
def test_a_horovod_script_runs_with_its_import_changed():
    comm = MPI.COMM_WORLD
    run = runpy.run_path(str(SCRIPT), run_name="__main__")
    flat = torch.cat([p.detach().reshape(-1) for p in run["model"].parameters()]).numpy()
    everyone = comm.allgather(flat.tobytes())
    assert all(b == everyone[0] for b in everyone)  # identical parameters on every rank
    acc = comm.allgather(float(run["test_accuracy"]))
    assert len(set(acc)) == 1 and acc[0] > 0.15  # one metric on every rank, above chance (0.1)


def test_each_horovod_name_against_the_native_call():
    hvd.init()
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3) + r
    native = collectives.allreduce(x.numpy(), op="sum")
    assert np.array_equal(hvd.allreduce(x, op=hvd.Sum).numpy(), native)
    assert np.array_equal(hvd.allreduce(x, average=False).numpy(), native)
    assert np.allclose(hvd.allreduce(x).numpy(), native / p)  # Average by default
    assert np.allclose(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
                       native * 1.5)
    assert torch.equal(hvd.allreduce(x, op=hvd.Max), x - r + p - 1)
    assert torch.equal(hvd.allreduce(torch.full((3,), 7, dtype=torch.int32), op=hvd.Average),
                       torch.full((3,), 7, dtype=torch.int32))  # integers average too
    y = x.clone()
    assert hvd.allreduce_(y, op=hvd.Sum) is y and np.array_equal(y.numpy(), native)
    h = hvd.allreduce_async(x, op=hvd.Sum)
    hvd.poll(h)
    assert np.array_equal(hvd.synchronize(h).numpy(), native)
    y = x.clone()
    assert hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum)) is y
    ys = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)
    assert np.array_equal(ys[1].numpy(), 2 * native)
    zs = [x.clone(), x.clone()]
    hvd.grouped_allreduce_(zs, op=hvd.Sum)
    assert np.array_equal(zs[0].numpy(), native)
    assert np.array_equal(hvd.synchronize(hvd.grouped_allreduce_async([x], op=hvd.Sum))[0].numpy(),
                          native)
    # allgather: first dimensions differ per rank
    mine = torch.full((r + 1, 2), float(r))
    expected = torch.cat([torch.from_numpy(a) for a in comm.allgather(mine.numpy())])
    assert torch.equal(hvd.allgather(mine), expected)
    assert torch.equal(hvd.synchronize(hvd.allgather_async(mine)), expected)
    assert torch.equal(hvd.grouped_allgather([mine, mine])[1], expected)
    # broadcast from the last rank
    root = p - 1
    b = torch.full((4,), float(r))
    assert torch.equal(hvd.broadcast(b, root), torch.full((4,), float(root)))
    assert torch.equal(b, torch.full((4,), float(r)))  # left as it is
    assert hvd.broadcast_(b, root_rank=root) is b and torch.equal(b, torch.full((4,), float(root)))
    # reducescatter: rank r gets its block of rows of the sum
    t = torch.arange(4.0 * p * 2).reshape(4 * p, 2) + r
    total = torch.from_numpy(collectives.allreduce(t.numpy(), op="sum"))
    assert torch.equal(hvd.reducescatter(t, op=hvd.Sum), total[4 * r:4 * r + 4])
    assert torch.equal(hvd.synchronize(hvd.reducescatter_async(t, op=hvd.Average)),
                       total[4 * r:4 * r + 4] / p)
    # autograd
    a = torch.ones(3, requires_grad=True)
    hvd.allreduce(a * (r + 1), op=hvd.Sum).sum().backward()
    assert torch.equal(a.grad, torch.full((3,), float((r + 1) * p)))
    a = torch.ones(r + 1, requires_grad=True)
    hvd.allgather(a).sum().backward()
    assert torch.equal(a.grad, torch.ones(r + 1))
    a = torch.ones(2, requires_grad=True)
    hvd.broadcast(a, 0).sum().backward()
    assert torch.equal(a.grad, torch.full((2,), 1.0 if r == 0 else 0.0))
    # objects, join, build questions
    assert hvd.broadcast_object({"r": r}, root_rank=root) == {"r": root}
    assert hvd.allgather_object(r) == comm.allgather(r)
    assert hvd.join() == p - 1  # all at once: the highest rank
    assert hvd.mpi_built() and hvd.mpi_enabled() and not hvd.gloo_built()
    assert hvd.nccl_built() == 0 and not hvd.ccl_built() and not hvd.rocm_built()
    assert isinstance(hvd.mpi_threads_supported(), bool)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=r)
    cross = comm.Split(node.rank, r)
    assert (hvd.cross_rank(), hvd.cross_size()) == (cross.rank, cross.size)
    assert hvd.is_homogeneous()
    node.Free(), cross.Free()


def test_process_sets_are_split_communicators():
    hvd.init()
    comm = MPI.COMM_WORLD
    r = comm.rank
    even = hvd.add_process_set([q for q in range(comm.size) if q % 2 == 0])
    odd = hvd.add_process_set([q for q in range(comm.size) if q % 2 == 1]) if comm.size > 1 else None
    mine = even if r % 2 == 0 else odd
    split = comm.Split(r % 2, r)
    x = torch.full((2,), float(r + 1))
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum, process_set=mine),
                       torch.from_numpy(collectives.allreduce(x.numpy(), op="sum", comm=split)))
    assert mine.size() == split.size and mine.rank() == split.rank and mine.included()
    assert hvd.broadcast_object(r, root_rank=mine.ranks[0], process_set=mine) == mine.ranks[0]
    assert hvd.global_process_set.size() == comm.size
    with pytest.raises(ValueError, match="registered already"):
        hvd.add_process_set(even.ranks)
    split.Free()
    for ps in (odd, even):
        if ps is not None:
            assert hvd.remove_process_set(ps)


def test_horovod_errors_and_compressors():
    hvd.init()
    comm = MPI.COMM_WORLD
    if comm.size > 1:
        with pytest.raises(hvd.HorovodInternalError, match="Mismatched allreduce"):
            hvd.allreduce(torch.ones(3 + comm.rank))  # on every rank
        with pytest.raises(RuntimeError, match="Mismatched broadcast"):
            hvd.broadcast(torch.ones(3), comm.rank)
    with pytest.raises(RuntimeError, match="Adasum"):
        hvd.allreduce(torch.ones(3), op=hvd.Adasum)
    t = torch.linspace(-1, 1, 5, dtype=torch.float64)
    c, ctx = hvd.Compression.fp16.compress(t)
    assert c.dtype == torch.float16 and hvd.Compression.fp16.decompress(c, ctx).dtype == t.dtype
    i = torch.ones(3, dtype=torch.int32)
    assert hvd.Compression.fp16.compress(i)[0].dtype == torch.int32
    assert hvd.Compression.none.compress(t)[0] is t
    assert torch.equal(hvd.allreduce(t, compression=hvd.Compression.fp16),
                       hvd.allreduce(t, codec="fp16"))


def test_alltoall_and_barrier_as_horovod_has_them():
    """``hvd.alltoall``: rows (first dimension) to each rank by ``splits`` or in equal parts, the
    received splits with ``splits``, against the rows every rank meant for this one; its
    gradient is the reverse exchange; bad splits on one rank raise ValueError on every rank,
    naming that rank (never a wait); ``hvd.barrier``."""
    hvd.init()
    comm = MPI.COMM_WORLD
    r, p = comm.rank, comm.size
    rows_for = lambda src, dst: (src + dst) % 3  # noqa: E731 - rows rank src sends rank dst
    for dtype in (torch.float32, torch.int64, torch.float16):
        parts = [torch.full((rows_for(r, j), 2, 3), 10 * r + j).to(dtype) for j in range(p)]
        got, received = hvd.alltoall(torch.cat(parts), torch.tensor(
            [rows_for(r, j) for j in range(p)], dtype=torch.int32))
        want = torch.cat([torch.full((rows_for(i, r), 2, 3), 10 * i + r).to(dtype)
                          for i in range(p)])
        assert torch.equal(got, want) and received.tolist() == [rows_for(i, r) for i in range(p)]
        equal = hvd.alltoall(torch.arange(2 * p).to(dtype))  # no splits: two rows each
        assert equal.tolist() == [2 * r + k for _ in range(p) for k in range(2)]
    x = torch.arange(3.0 * p).reshape(p, 3).requires_grad_()
    y = hvd.alltoall(x)
    (y * (1 + r)).sum().backward()  # the gradient of row j comes back from rank j
    assert torch.equal(x.grad, torch.arange(1.0, p + 1).repeat_interleave(3).reshape(p, 3))
    if p > 1:
        with pytest.raises(ValueError, match="invalid arguments on rank 0: splits sum to"):
            hvd.alltoall(torch.ones(p), torch.tensor([5] * p, dtype=torch.int32)
                         if r == 0 else None)
        with pytest.raises(ValueError, match="divisible"):
            hvd.alltoall(torch.ones(p + 1))
    hvd.barrier()


@pytest.mark.world_sizes(2, 4)
def test_async_calls_are_matched_by_name_in_the_background():
    """Horovod's coordinator: named ``*_async`` calls submitted in different orders on different
    ranks complete with the right results; a second call with a name still pending on this rank
    raises ValueError at once, before any message; an async call returns before the other
    ranks submit theirs (rank 1 submits 0.5 s later)."""
    hvd.init()
    comm = MPI.COMM_WORLD
    r, p = comm.rank, comm.size
    names = ["w", "x", "y", "z"]
    order = names[r % 4:] + names[:r % 4]  # every rank its own order
    x = torch.arange(6.0).reshape(3, 2) + r
    handles = {}
    for n in order:
        k = names.index(n)
        if n == "x":
            handles[n] = hvd.allgather_async(torch.full((r + 1, 2), float(r)), name=n)
        elif n == "y":
            handles[n] = hvd.broadcast_async(x + k, root_rank=p - 1, name=n)
        else:
            handles[n] = hvd.allreduce_async(x + k, name=n, op=hvd.Sum)
    native = torch.from_numpy(collectives.allreduce(x.numpy(), op="sum"))
    assert torch.equal(hvd.synchronize(handles["z"]), native + 3 * p)
    assert torch.equal(hvd.synchronize(handles["w"]), native)
    assert torch.equal(hvd.synchronize(handles["y"]), x - r + p - 1 + 2)
    assert torch.equal(hvd.synchronize(handles["x"]),
                       torch.cat([torch.full((q + 1, 2), float(q)) for q in range(p)]))
    # a name pending on this rank: ValueError at once; the others are not involved
    if r == 0:
        h = hvd.allreduce_async(x, name="twice", op=hvd.Sum)
        with pytest.raises(ValueError, match="'twice' is already pending"):
            hvd.allreduce_async(x, name="twice", op=hvd.Sum)
    hvd.barrier()
    if r != 0:
        h = hvd.allreduce_async(x, name="twice", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(h), native)
    # returns at once: rank 1 submits 0.5 s later
    comm.Barrier()
    t0 = time.perf_counter()
    if r == 1:
        time.sleep(0.5)
    h = hvd.allreduce_async(x, name="late", op=hvd.Sum)
    returned = time.perf_counter() - t0
    assert torch.equal(hvd.synchronize(h), native)
    waited = time.perf_counter() - t0
    if r == 0:
        assert returned < 0.1 and waited > 0.4, (returned, waited)
    # unnamed calls match in submission order, mixed with named ones
    h1 = hvd.allreduce_async(x, op=hvd.Sum)
    h2 = hvd.allreduce_async(2 * x, name="named", op=hvd.Sum)
    h3 = hvd.allgather_async(x)
    assert torch.equal(hvd.synchronize(h3), torch.cat([x - r + q for q in range(p)]))
    assert torch.equal(hvd.synchronize(h2), 2 * native)
    assert torch.equal(hvd.synchronize(h1), native)


@pytest.mark.world_sizes(2, 4)
def test_join_stands_in_for_named_allreduces():
    """``hvd.join()`` on the named stream: the joined rank takes part in the others' named
    allreduces with zeros; their allgather raises RuntimeError (HorovodInternalError) on the
    ranks that called it; join returns the rank that joined last, on every rank."""
    hvd.init()
    comm = MPI.COMM_WORLD
    r, p = comm.rank, comm.size
    x = torch.full((4,), float(r + 1))
    if r == 0:
        last = hvd.join()
    else:
        a = hvd.allreduce_async(x, name="a", op=hvd.Sum)
        b = hvd.allreduce_async(2 * x, name="b", average=True)
        total = sum(range(2, p + 1))
        assert torch.equal(hvd.synchronize(b), torch.full((4,), 2.0 * total / p))
        assert torch.equal(hvd.synchronize(a), torch.full((4,), float(total)))
        with pytest.raises(hvd.HorovodInternalError, match="have joined"):
            hvd.allgather(x)
        last = hvd.join()
    assert comm.allgather(last) == [last] * p and last != 0
