"""Framework tensors and collectives.torch under real multi-rank runs (skipped without torch).

Tensors of every supported dtype (bfloat16 included) through every collective against the
gather-and-reduce reference, bitwise identical on every rank, returned as tensors, into out=
tensors; non-contiguous tensors rejected on every rank. DistributedOptimizer against a
one-process run over the global batch (dense algorithms, the identity codec with error
feedback, gradient accumulation), lossy codecs with error feedback identical on every rank,
requests named after the parameters (two optimizers built in different orders on different
ranks; duplicate names rejected), unused parameters, broadcasts after different random inits,
codec state checkpoints; the DDP comm hook against DDP's own allreduce over gloo, and its future
completed on the engine's thread.
"""

import json
import threading

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import compress
from reference import gather_all

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
import collectives.torch as ct  # noqa: E402

# Tensors through the collectives and the PyTorch integration's plumbing: the algorithms under
# them run at every size in mpi_allreduce.py; one rank, two and an odd number here
# (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3)

torch.set_num_threads(1)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8]
BF16 = np.dtype(ml_dtypes.bfloat16)


def _np(t):
    """A tensor's values as NumPy (bfloat16 as float32, exact)."""
    t = t.detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _bits(t):
    t = t.detach().contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()


def _identical(t, comm):
    everyone = comm.allgather(_bits(t))
    return all(b == everyone[0] for b in everyone)


def _input(dtype, n, rank):
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    return torch.randint(0, 5, (n,), generator=g).to(dtype)


def _reference(x, comm, op):
    rows = gather_all(_np(x).astype(np.float64), comm)
    return {"sum": rows.sum(0), "max": rows.max(0), "avg": rows.mean(0)}[op]


def _tolerance(dtype, comm):
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24,
           torch.float64: 2.0 ** -53}.get(dtype, 0.0)
    return 2 * comm.size * eps  # one rounding per pairwise step, relative to the sum of |x|


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensors_through_every_collective(dtype, comm):
    """Each collective on CPU tensors of ``dtype``: a tensor of that dtype comes back, equal to
    the reference (floats within one rounding per pairwise step), identical on every rank."""
    n = 2 * comm.size + 1
    x = _input(dtype, n, comm.rank)
    absum = gather_all(np.abs(_np(x)).astype(np.float64), comm).sum(0)
    ops = ["sum", "max"] + (["avg"] if dtype.is_floating_point else [])
    for op in ops:
        # every algorithm for bfloat16 (its word-form reduction is new), two for the others
        for algorithm in collectives.ALGORITHMS if dtype == torch.bfloat16 else ("auto", "native"):
            y = collectives.allreduce(x, op=op, algorithm=algorithm, comm=comm)
            what = f"{algorithm} {dtype} {op} p={comm.size}"
            assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.shape == x.shape, what
            ref = _reference(x, comm, op)
            tol = _tolerance(dtype, comm) * absum + (1e-30 if op != "avg" else 0)
            err = np.abs(_np(y).astype(np.float64) - ref)
            assert (err <= tol / (comm.size if op == "avg" else 1) + 1e-12).all(), \
                (what, err.max(), tol.max())
            assert _identical(y, comm), what
    # the blocks, into out= tensors and as new tensors
    full = collectives.allreduce(x, comm=comm, algorithm="ring")
    counts = collectives._runtime.ranks.partition(n, comm.size)
    block = torch.empty(counts[comm.rank + 1] - counts[comm.rank], dtype=dtype)
    assert collectives.reduce_scatter(x, out=block, comm=comm) is block
    assert torch.equal(block, full[counts[comm.rank]:counts[comm.rank + 1]])
    gathered = collectives.allgather(x, comm=comm)
    assert isinstance(gathered, torch.Tensor) and gathered.dtype == dtype
    rows = gather_all(_np(x), comm).reshape(-1)
    assert np.array_equal(_np(gathered), rows)
    b = x.clone()
    assert collectives.bcast(b, root=comm.size - 1, comm=comm) is b
    assert np.array_equal(_np(b), gather_all(_np(x), comm)[comm.size - 1])
    r = collectives.reduce(x, root=0, op="max", comm=comm)
    ref = _reference(x, comm, "max")  # collective: on every rank
    assert (r is None) == (comm.rank != 0)
    if r is not None:
        assert isinstance(r, torch.Tensor) and np.array_equal(_np(r), ref)


def test_in_place_through_another_view(comm):
    """``allreduce(t.numpy(), out=t.numpy())``: two objects, one memory, counts as in place."""
    t = torch.full((5,), float(comm.rank + 1))
    y = collectives.allreduce(t.numpy(), out=t.numpy(), comm=comm)
    assert isinstance(y, np.ndarray)
    assert torch.equal(t, torch.full((5,), comm.size * (comm.size + 1) / 2))
    out = torch.empty(5)
    assert collectives.allreduce(t, out=out, op="max", comm=comm) is out
    with pytest.raises(ValueError, match="overlaps"):  # partial overlap stays an error
        buf = torch.zeros(6)
        collectives.allreduce(buf[:5], out=buf[1:], comm=comm)


def test_tensor_repeats_are_remembered_and_checked_again_when_changed(monkeypatch):
    """``allreduce(t, out=o)`` repeated on the same CPU tensors runs its remembered call (views
    of the tensors' memory made once, _runtime/repeats.py), with the bits of its first call and
    of the same call on NumPy arrays: out of place and in place, float32 and bfloat16, and
    ``iallreduce`` too. A tensor changed in place is checked again, never repeated onto memory
    it left: ``resize_`` (a new shape), a new storage through ``set_`` (the old one
    untouched), ``.data =`` a tensor of another dtype, ``requires_grad_`` (refused)."""
    from collectives import api
    from collectives._runtime.repeats import REPEATS

    comm = MPI.COMM_WORLD.Dup()
    if comm.size == 1:
        comm.Free()
        pytest.skip("one process: calls are trivial, never remembered")
    checked = []
    original = api.run_call
    monkeypatch.setattr(api, "run_call", lambda *a: checked.append(a[0]) or original(*a))
    for dtype in (torch.float32, torch.bfloat16):
        before = _input(dtype, 1001, comm.rank)
        as_numpy = before.view(torch.int16).numpy().view(BF16) if dtype == torch.bfloat16 \
            else before.numpy()
        want = collectives.allreduce(as_numpy.copy(), comm=comm)
        want = want.view(np.int16) if dtype == torch.bfloat16 else want
        x, o, z = before.clone(), torch.empty_like(before), before.clone()
        checked.clear()
        for _ in range(3):
            o.zero_()
            assert collectives.allreduce(x, out=o, comm=comm) is o
            assert _bits(o) == want.tobytes(), dtype
            o.zero_()
            assert collectives.iallreduce(x, out=o, comm=comm).wait() is o
            assert _bits(o) == want.tobytes(), dtype
            z.copy_(before)
            assert collectives.allreduce(z, out=z, comm=comm) is z
            assert _bits(z) == want.tobytes(), dtype
        assert checked == [api.AllreduceCall] * 2, (dtype, checked)  # the first calls only
        entry = next(e for e in REPEATS.recent if e.x() is z)
        assert entry.form == "allreduce" and entry.src is not None and entry.dst is entry.src
    p = comm.size
    x, o = before.float(), torch.empty(1001)  # float32 from here
    want = collectives.allreduce(x.numpy().copy(), comm=comm)
    for _ in range(2):
        collectives.allreduce(x, out=o, comm=comm)
    checked.clear()
    x.resize_(1000)  # a new shape (in the same storage: DLPack made it not resizable)
    with pytest.raises(ValueError, match="shape"):
        collectives.allreduce(x, out=o, comm=comm)
    o.resize_(1000)
    shorter = collectives.allreduce(x.numpy().copy(), comm=comm)
    for _ in range(2):
        o.zero_()
        assert collectives.allreduce(x, out=o, comm=comm) is o
        assert _bits(o) == shorter.tobytes()
    assert len(checked) == 3  # the error, the first call of the new shape, the NumPy call
    old = o.view(-1)  # o's storage of now, which set_ leaves
    x.set_(before.float().clone())
    o.set_(torch.empty(1001))
    old.zero_()
    for _ in range(2):
        assert collectives.allreduce(x, out=o, comm=comm) is o
        assert _bits(o) == want.tobytes()
    assert not old.any()  # never written: the repeat follows o to its new storage
    x.data = before.double()  # another dtype, through .data: the same objects
    o.data = torch.empty(1001, dtype=torch.float64)
    want64 = collectives.allreduce(before.double().numpy(), comm=comm)
    for _ in range(2):
        assert collectives.allreduce(x, out=o, comm=comm) is o
        assert _bits(o) == want64.tobytes()
    x.requires_grad_()
    with pytest.raises(TypeError, match="requires grad"):
        collectives.allreduce(x, out=o, comm=comm)
    x.requires_grad_(False)
    assert np.array_equal(collectives.allreduce(x, out=o, comm=comm).numpy(),
                          want64) and p > 1
    comm.Free()


def test_non_contiguous_rejected_on_every_rank(comm):
    """Every rank gets the clear error; with validate=True through the cross-check too."""
    t = torch.zeros(4, 6)[:, ::2]
    for validate in (False, True):
        with pytest.raises(ValueError, match=r"contiguous.*x\.contiguous\(\)"):
            collectives.allreduce(t, comm=comm, validate=validate)
    # one rank's bad tensor fails every rank under validate, and the ranks stay in step
    x = t if comm.rank == 0 else torch.zeros(4, 3)
    with pytest.raises(ValueError, match="contiguous"):
        collectives.allreduce(x, comm=comm, validate=True)
    assert float(collectives.allreduce(torch.ones(1), comm=comm)) == comm.size


def test_nonblocking_and_compressed_take_tensors(comm):
    """iallreduce, allreduce_init and compressed_allreduce give tensors back."""
    x = torch.arange(7, dtype=torch.bfloat16) + comm.rank
    y = collectives.iallreduce(x, op="avg", comm=comm).wait(timeout=120)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and _identical(y, comm)
    g = torch.ones(9)
    plan = collectives.allreduce_init(g, out=g, comm=comm)
    assert plan() is g and float(g[0]) == comm.size
    z = collectives.compressed_allreduce(torch.ones(10), compress.get("fp16"), comm=comm)
    assert isinstance(z, torch.Tensor) and torch.allclose(z, torch.ones(10), atol=1e-3)


# ---------------------------------------------------------------------- DistributedOptimizer

class _WithSide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        self.side = torch.nn.Linear(6, 3)  # used on even ranks only

    def forward(self, x, side):
        return self.body(x) + self.side(x) if side else self.body(x)


def _model(seed=0, extra=False):
    torch.manual_seed(seed)
    if extra:
        return _WithSide()
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _data(comm, per_rank=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(per_rank * comm.size, 6, generator=g)
    y = torch.randint(0, 3, (per_rank * comm.size,), generator=g)
    lo = comm.rank * per_rank
    return x, y, x[lo:lo + per_rank], y[lo:lo + per_rank]


def _flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def _one_process(steps, x, y, micro=1):
    ref = _model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
            (torch.nn.functional.cross_entropy(ref(xs), ys) / micro).backward()
        opt.step()
    return _flat(ref)


@pytest.mark.parametrize("kw", [dict(), dict(algorithm="ring", bucket_bytes=64),
                                dict(algorithm="recursive_doubling", bucket_bytes=200),
                                dict(codec="none", error_feedback=True, bucket_bytes=100)],
                         ids=["auto", "ring-buckets", "rd-buckets", "identity-ef"])
def test_optimizer_equals_one_process(kw):
    comm = MPI.COMM_WORLD  # the optimizer tests: one communicator is enough
    x, y, xl, yl = _data(comm)
    m = _model()
    opt = ct.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                  m.named_parameters(), comm=comm, **kw)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(xl), yl).backward()
        opt.step()
    assert torch.allclose(_flat(m), _one_process(3, x, y), rtol=1e-5, atol=1e-6)
    assert _identical(_flat(m), comm)


def test_gradient_accumulation():
    """backward_passes_per_step=2: two micro-batches per rank, one exchange, the global batch."""
    comm = MPI.COMM_WORLD  # the optimizer tests: one communicator is enough
    x, y, xl, yl = _data(comm, per_rank=4)
    m = _model()
    opt = ct.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                  backward_passes_per_step=2, comm=comm, bucket_bytes=100)
    for _ in range(2):
        opt.zero_grad()
        for xs, ys in zip(xl.chunk(2), yl.chunk(2)):
            (torch.nn.functional.cross_entropy(m(xs), ys) / 2).backward()
        opt.step()
    # rank r's micro-batch j holds samples r*4 + 2j, +1: the one-process run's global batch
    assert torch.allclose(_flat(m), _one_process(2, x, y), rtol=1e-5, atol=1e-6)
    assert _identical(_flat(m), comm)
    opt.zero_grad()
    for _ in range(3):  # a third backward without step() is an error, as in Horovod
        try:
            torch.nn.functional.cross_entropy(m(xl), yl).backward()
        except AssertionError as exc:
            assert "backward_passes_per_step" in str(exc)
            break
    else:
        pytest.fail("a third backward pass was accepted")
    opt.synchronize()  # the ranks stay in step


@pytest.mark.parametrize("codec", ["fp16", "topk:ratio=0.25", "powersgd:rank=1", "randomk:ratio=0.5"])
def test_optimizer_codecs_with_error_feedback(codec):
    """Lossy codecs with error feedback: identical parameters everywhere, close to the dense
    run after a few steps, and the codec state survives a state_dict round trip."""
    comm = MPI.COMM_WORLD  # the optimizer tests: one communicator is enough
    x, y, xl, yl = _data(comm)
    m = _model()
    opt = ct.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                  codec=codec, error_feedback=True, comm=comm)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(xl), yl).backward()
        opt.step()
    assert _identical(_flat(m), comm), codec
    assert torch.allclose(_flat(m), _one_process(3, x, y), atol=0.2), codec
    saved = opt.state_dict()
    residuals = {k: v for k, v in saved["collectives"]["codec"].items() if k.startswith("memory")}
    assert residuals, codec
    m2 = _model()
    opt2 = ct.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9),
                                   codec=codec, error_feedback=True, comm=comm)
    opt2.load_state_dict(saved)
    again = opt2.state_dict()["collectives"]["codec"]
    assert all(torch.equal(again[k], v) for k, v in residuals.items()), codec


def test_optimizer_takes_auto_and_follows_its_dense_decisions():
    """codec="auto:topk:ratio=0.25": on one machine's model the small buckets go dense, so the
    parameters are those of the dense optimizer bit for bit; every rank records the same
    decisions."""
    comm = MPI.COMM_WORLD
    x, y, xl, yl = _data(comm)
    models = []
    for codec in ("auto:topk:ratio=0.25", None):
        m = _model()
        opt = ct.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                      codec=codec, algorithm="ring", comm=comm)
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(xl), yl).backward()
            opt.step()
        models.append(_flat(m))
        if codec:
            auto = opt.codec_state.auto
            decided = {k: (d.compress, d.calls_dense) for k, d in auto.decisions.items()}
            assert decided and all(not c and n == 3 for c, n in decided.values()), decided
            assert all(d == decided for d in comm.allgather(decided))
    assert _bits(models[0]) == _bits(models[1])


def test_optimizer_takes_dgc_as_published():
    """DGCMemory with the sparsity warm-up and local clipping through DistributedOptimizer (the
    wrapped SGD without momentum: the memory applies it): the density follows the schedule step
    by step, every rank ends with the same parameters, momentum and velocity are in state_dict."""
    comm = MPI.COMM_WORLD
    _, _, xl, yl = _data(comm)
    m = _model()
    warmup = compress.SparsityWarmup(steps_per_stage=1, stages=2)
    memory = compress.DGCMemory(compress.get("topk", ratio=0.01), momentum=0.9, warmup=warmup,
                                clip=1.0 / comm.size ** 0.5)
    opt = ct.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), codec=memory,
                                  comm=comm)
    for step, density in enumerate([0.25, 0.0625, 0.01, 0.01]):
        _train(m, opt, xl, yl)
        assert memory.codec.ratio == density, (step, memory.codec.ratio)
    assert _identical(_flat(m), comm)
    saved = opt.state_dict()["collectives"]["codec"]
    assert any(k.startswith("memory/u/") for k in saved) and \
        any(k.startswith("memory/v/") for k in saved), sorted(saved)


def test_optimizer_encodes_on_the_engine_thread():
    """A bucket's encode runs on the communicator's engine thread, not on the thread that runs
    backward (issue 24: encoding off the critical path)."""
    comm = MPI.COMM_WORLD
    _, _, xl, yl = _data(comm)
    m = _model()
    memory = compress.ErrorFeedback(compress.get("topk", ratio=0.1))
    threads = []
    encode = memory.encode

    def recording(*args, **kwargs):
        threads.append(threading.current_thread())
        return encode(*args, **kwargs)

    memory.encode = recording
    opt = ct.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), codec=memory,
                                  bucket_bytes=64, comm=comm)
    _train(m, opt, xl, yl, steps=2)
    if comm.size == 1:  # one process: a non-blocking call runs at once on the caller's thread
        assert threads and set(threads) == {threading.main_thread()}, threads
    else:
        assert threads and threading.main_thread() not in threads, threads


def _residual_keys(opt):
    """The bucket names an optimizer's error feedback is keyed by (codec state in state_dict)."""
    head = "memory/error/"
    return {k[len(head):] for k in opt.state_dict()["collectives"]["codec"] if k.startswith(head)}


def _train(m, opt, xl, yl, steps=1):
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(xl), yl).backward()
        opt.step()


def test_optimizer_names_come_from_the_parameters():
    """Buckets (requests and codec-state keys) are named after their parameters: the first's
    name and how many more (named_parameters), or the place in param_groups; the same on every
    rank; a checkpoint's state is found again by a new optimizer (no new keys appear)."""
    comm = MPI.COMM_WORLD  # the optimizer tests: one communicator is enough
    _, _, xl, yl = _data(comm)
    kw = dict(codec="none", error_feedback=True, bucket_bytes=200, comm=comm)
    # reversed registration order: 2.bias 12 B + 2.weight 96 B + 0.bias 32 B, then 0.weight
    m = _model()
    opt = ct.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(),
                                  **kw)
    _train(m, opt, xl, yl)
    named = {"collectives.torch.grad.2.bias+2", "collectives.torch.grad.0.weight"}
    assert _residual_keys(opt) == named
    assert all(k == _residual_keys(opt) for k in comm.allgather(_residual_keys(opt)))
    saved = opt.state_dict()
    m2 = _model()
    opt2 = ct.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1),
                                   m2.named_parameters(), **kw)
    opt2.load_state_dict(saved)
    _train(m2, opt2, xl, yl)
    assert _residual_keys(opt2) == named  # the loaded residuals were used, not new ones
    # no names: the place in param_groups (group, index), here over two groups
    m3 = _model()
    params = list(m3.parameters())
    opt3 = ct.DistributedOptimizer(torch.optim.SGD([{"params": params[:2]},
                                                    {"params": params[2:]}], lr=0.1), **kw)
    _train(m3, opt3, xl, yl)
    assert _residual_keys(opt3) == {"collectives.torch.grad.group1.param1+2",
                                    "collectives.torch.grad.group0.param0"}


def test_optimizer_rejects_duplicate_and_missing_names():
    m = _model()
    sgd = torch.optim.SGD(m.parameters(), lr=0.1)
    same = [("w", p) for p in m.parameters()]
    with pytest.raises(ValueError, match="duplicate names: w "):
        ct.DistributedOptimizer(sgd, same)
    with pytest.raises(ValueError, match=r"lacks 2 of the optimizer's parameters"):
        ct.DistributedOptimizer(sgd, list(m.named_parameters())[:2])
    with pytest.raises(ValueError, match=r"\(name, parameter\) pairs"):
        ct.DistributedOptimizer(sgd, list(m.parameters()))


def test_optimizers_built_in_different_orders_pair_their_requests():
    """Two optimizers over two models of the same shapes, built (and backpropagated, and
    stepped) in one order on even ranks and in the other on odd ranks: their buckets pair by
    parameter name, so each model matches its one-process run. Names from a count of the
    optimizers built so far paired model a's buckets with model b's here."""
    comm = MPI.COMM_WORLD  # the optimizer tests: one communicator is enough
    data = {"a": _data(comm, seed=1), "b": _data(comm, seed=2)}
    models = {k: _model() for k in data}
    order = ["a", "b"] if comm.rank % 2 == 0 else ["b", "a"]
    opts = {}
    for k in order:
        opts[k] = ct.DistributedOptimizer(
            torch.optim.SGD(models[k].parameters(), lr=0.1, momentum=0.9),
            [(f"{k}.{n}", p) for n, p in models[k].named_parameters()], comm=comm,
            bucket_bytes=100)
    for _ in range(3):
        for k in order:
            opts[k].zero_grad()
        for k in order:
            _, _, xl, yl = data[k]
            torch.nn.functional.cross_entropy(models[k](xl), yl).backward()
        for k in order:
            opts[k].step()
    for k, (x, y, _, _) in data.items():
        assert torch.allclose(_flat(models[k]), _one_process(3, x, y), rtol=1e-5, atol=1e-6), k
        assert _identical(_flat(models[k]), comm), k


def test_unused_parameters_do_not_hang():
    """A layer used on even ranks only: odd ranks start its bucket at step() with zeros."""
    comm = MPI.COMM_WORLD  # the optimizer tests: one communicator is enough
    x, y, xl, yl = _data(comm)
    m = _model(extra=True)
    opt = ct.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), comm=comm,
                                  bucket_bytes=64)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(xl, comm.rank % 2 == 0), yl).backward()
        opt.step()
    assert _identical(_flat(m), comm)
    if comm.size > 1:
        assert not torch.equal(m.side.weight, _model(extra=True).side.weight)


def test_broadcasts_after_different_inits():
    comm = MPI.COMM_WORLD  # the optimizer tests: one communicator is enough
    m = _model(seed=comm.rank)
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    if comm.rank == 0:  # only the root has optimizer state yet
        torch.nn.functional.cross_entropy(m(torch.ones(2, 6)), torch.zeros(2, dtype=torch.long)).backward()
        opt.step()
        opt.param_groups[0]["lr"] = 0.5
    ct.broadcast_parameters(m.state_dict(), root=0, comm=comm)
    ct.broadcast_optimizer_state(opt, root=0, comm=comm)
    assert _identical(_flat(m), comm)
    assert opt.param_groups[0]["lr"] == 0.5
    state = opt.state_dict()["state"]
    assert len(state) == 4 and _identical(state[0]["exp_avg"], comm)
    t = torch.full((3,), float(comm.rank))
    assert ct.allreduce_(t, comm=comm) is t
    assert torch.allclose(t, torch.full((3,), (comm.size - 1) / 2))


def test_ddp_comm_hook_against_ddp():
    """DDP over gloo (init_process_group: rendezvous through MPI): its own allreduce, and our
    hook with a dense algorithm (same parameters) and with PowerSGD and top-k + error feedback
    (identical everywhere). COMM_WORLD only: one gloo group at a time."""
    comm = MPI.COMM_WORLD
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    ct.init_process_group(comm)
    try:
        _, _, xl, yl = _data(comm)

        def run(state, hook=ct.comm_hook):
            m = DDP(_model(), bucket_cap_mb=0.0002)
            if state is not None:
                m.register_comm_hook(state, hook)
            opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
            for _ in range(3):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(m(xl), yl).backward()
                opt.step()
            return _flat(m.module)

        base = run(None)
        dense = run(ct.CommHookState(comm, algorithm="ring"))
        assert torch.allclose(dense, base, rtol=1e-5, atol=1e-6) and _identical(dense, comm)
        for codec in ("powersgd:rank=1", "topk:ratio=0.25"):
            state = ct.CommHookState(comm, codec=codec, error_feedback=True)
            got = run(state)
            assert _identical(got, comm), codec
            assert torch.allclose(got, base, atol=0.2), codec
            assert any(k.startswith("memory") for k in state.state_dict()["codec"]), codec
        # start_powerSGD_iter's counterpart: the three iterations before it are the dense ones;
        # the same bits where the bucket travels whole (PowerSGD sends each tensor alone: other
        # ring blocks, so other rounding from 4 ranks on)
        for codec in ("topk:ratio=0.25", "powersgd:rank=1"):
            late = ct.CommHookState(comm, algorithm="ring", codec=codec, error_feedback=True,
                                    start_step=3)
            got = run(late)
            assert torch.equal(got, dense) if codec.startswith("topk") else \
                torch.allclose(got, dense, rtol=1e-5, atol=1e-6), codec
            assert not any(k.startswith("memory") for k in late.state_dict()["codec"]), codec
        with pytest.raises(ValueError, match="start_step"):
            ct.CommHookState(comm, codec="powersgd:rank=1", start_step=-1)
        # the gossip hook on the full graph (W = 11^T / p) is the allreduce average, to rounding
        full = run(ct.GossipHookState(collectives.topology.full(comm.size), comm), ct.gossip_hook)
        assert torch.allclose(full, dense, rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()


class _FakeBucket:
    """What :func:`collectives.torch.comm_hook` reads of a ``dist.GradBucket``: one tensor."""

    def __init__(self, buf):
        self.buf = buf

    def buffer(self):
        return self.buf

    def gradients(self):
        return [self.buf]

    def index(self):
        return 0

    def is_last(self):
        return True


def _boom_algorithm(src, buf, op, ctx, opts):
    """An allreduce that fails on rank 0 before sending anything (others do nothing)."""
    if ctx.comm.rank == 0:
        raise ZeroDivisionError("injected failure")


def test_gossip_hook_is_a_neighbor_round_of_the_bucket(comm):
    """The gossip hook replaces the bucket, in place, by neighbor_allreduce of it: bit for bit on
    the ring and on the one-peer exponential graph (the iteration as its step, two iterations);
    on the full graph it is the allreduce hook's average, to rounding."""
    from collectives.decentralized import topology

    p = comm.size
    for graph in (topology.ring(p), topology.one_peer_exponential(p)):
        state = ct.GossipHookState(graph, comm)
        for it in range(2):
            buf = _input(torch.float32, 37, comm.rank + 10 * it)
            want = collectives.neighbor_allreduce(buf.numpy().copy(), graph, step=it, comm=comm)
            got = ct.gossip_hook(state, _FakeBucket(buf)).wait()
            assert got.data_ptr() == buf.data_ptr()
            assert np.array_equal(buf.numpy(), want), (graph.name, it)
        assert state.iteration == 2
    buf = _input(torch.float64, 29, comm.rank)
    dense = buf.clone()
    ct.gossip_hook(ct.GossipHookState(topology.full(p), comm), _FakeBucket(buf)).wait()
    ct.comm_hook(ct.CommHookState(comm, algorithm="ring"), _FakeBucket(dense)).wait()
    assert torch.allclose(buf, dense, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="is for"):
        ct.GossipHookState(topology.ring(p + 1), comm)
    with pytest.raises(TypeError, match="Topology"):
        ct.GossipHookState("ring", comm)


def test_comm_hook_future_is_completed_on_the_engine_thread():
    """The hook's future is completed by its request's completion callback, no waiter thread:
    on the engine's thread when the request completes after the hook returned (rank 0 hooks
    before the others), with the averaged bucket; with the operation's exception where the
    operation fails."""
    world = MPI.COMM_WORLD
    comm = world.Dup()
    collectives.iallreduce(np.ones(2), comm=comm).wait(timeout=120)  # engines exist
    state = ct.CommHookState(comm, algorithm="ring")
    buf = torch.full((6,), float(comm.rank))
    ran_on = []

    def record(f):
        ran_on.append(threading.current_thread().name)
        return f.value()

    if comm.rank == 0:
        fut = ct.comm_hook(state, _FakeBucket(buf))
        pending = not fut.done()
        chained = fut.then(record)
    comm.Barrier()
    if comm.rank != 0:
        fut = ct.comm_hook(state, _FakeBucket(buf))
        chained = fut.then(record)
    got = chained.wait()
    assert got.data_ptr() == buf.data_ptr()  # in place
    assert torch.equal(buf, torch.full((6,), (comm.size - 1) / 2))
    assert state.iteration == 1 and len(ran_on) == 1
    if comm.size == 1:  # completed during the hook: then() ran on this thread
        assert ran_on == [threading.current_thread().name]
    elif comm.rank == 0:
        assert pending and ran_on[0].startswith("collectives-engine"), (pending, ran_on)
    assert not [t.name for t in threading.enumerate() if "comm_hook" in t.name]
    world.Barrier()
    comm.Free()
    # a failed operation: the future carries its exception on the failing rank
    comm = world.Dup()
    collectives.ALGORITHMS["_boom"] = _boom_algorithm
    try:
        fut = ct.comm_hook(ct.CommHookState(comm, algorithm="_boom"), _FakeBucket(torch.ones(8)))
        if comm.size > 1 and comm.rank == 0:
            with pytest.raises(ZeroDivisionError, match="injected failure"):
                fut.wait()
        else:
            fut.wait()
    finally:
        del collectives.ALGORITHMS["_boom"]
    world.Barrier()
    comm.Free()


def test_comm_hook_future_times_out_when_a_rank_never_arrives(monkeypatch):
    """Nobody waits on the hook's requests, so the watchdog gives them a wait's timeout: with
    COLLECTIVES_TIMEOUT set, rank 0's future fails with TimeoutError while the other ranks have
    not started the bucket; the operation stays in flight and completes when they do."""
    world = MPI.COMM_WORLD
    comm = world.Dup()
    collectives.iallreduce(np.ones(2), comm=comm).wait(timeout=120)  # engines exist
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "0.5")
    state = ct.CommHookState(comm, algorithm="ring")
    buf = torch.full((6,), float(comm.rank))
    if comm.rank == 0:
        fut = ct.comm_hook(state, _FakeBucket(buf))
        if comm.size > 1:
            with pytest.raises(TimeoutError, match="timed out after 0.5 s"):
                fut.wait()
    comm.Barrier()
    if comm.rank != 0:
        fut = ct.comm_hook(state, _FakeBucket(buf))
    if comm.size == 1 or comm.rank != 0:
        fut.wait()
    collectives.iallreduce(np.ones(2), comm=comm).wait(timeout=120)  # the engine went on
    assert torch.equal(buf, torch.full((6,), (comm.size - 1) / 2))  # rank 0's too, in the end
    world.Barrier()
    comm.Free()


# 2 and 3: an exchange to overlap, and an odd number (one rank has nothing to overlap, and its
# overlapped run took 61 s against 4 at 2 ranks on the loaded 2-core machine)
@pytest.mark.world_sizes(2, 3)
@pytest.mark.mpi(min_size=2)
def test_trainer_overlap_and_blocking_agree():
    """``python -m collectives.torch.train`` on the digits, in both exchanges of
    DistributedOptimizer and with ``--convs 3``: the model has the layers asked for, parameters
    end bitwise identical on every rank, and both exchanges train to the same accuracies (the
    same buckets, reduced by the same algorithm), the overlapped one under ``--timeline``, whose
    file has the trainer's phases on every rank."""
    import tempfile

    from collectives.diagnostics import timeline
    from collectives.torch.train import main

    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0) + "/t.json"
    argv = ["--epochs", "1", "--batch-size", str(16 * comm.size), "--width", "4",
            "--hidden", "8", "--convs", "3", "--bucket-mb", "0.001", "--quiet"]
    log = path[:-len("t.json")] + "log.json"
    runs = {ex: main([*argv, "--exchange", ex,
                      *(["--timeline", path, "--log", log] if ex == "overlap" else [])])
            for ex in ("overlap", "blocking")}
    if comm.rank == 0:
        with open(log) as f:  # --log: collectives.sgd's format, one record per epoch
            written = json.load(f)
        assert written["summary"]["test_acc"] == runs["overlap"]["test_acc"]
        assert written["summary"]["label"] == "torch overlap none auto"
        (record,) = written["epochs"]
        assert record["epoch"] == 1 and 0 < record["wall_s"] <= runs["overlap"]["wall_s"]
        doc = timeline.chrome.read(path)
        timeline.check(doc)
        phases = {(e["pid"], e["name"]) for e in doc["traceEvents"] if e.get("cat") == "user"}
        assert phases == {(r, n) for r in range(comm.size)
                          for n in ("forward+backward", "synchronize", "update")}
    convs = 1 * 4 * 9 + 4 + 2 * (4 * 4 * 9 + 4)
    for summary in runs.values():
        assert summary["params"] == convs + (4 * 16 * 8 + 8) + (8 * 10 + 10)
        assert summary["identical"]
    assert (runs["overlap"]["test_acc"], runs["overlap"]["train_acc"]) == \
        (runs["blocking"]["test_acc"], runs["blocking"]["train_acc"])
    with pytest.raises(SystemExit, match="--convs must be at least 1"):
        main([*argv, "--convs", "0"])
    with pytest.raises(SystemExit) as e:  # argparse's usage error (exit 2), before training
        main([*argv, "--log", "run.txt"])
    assert e.value.code == 2


def test_horovod_process_functions():
    """init/rank/size/local_rank/local_size as Horovod's: rank and size without init, the local
    ones after it (ValueError before); init(comm) makes comm every function's default."""
    from collectives.torch import basics

    world = MPI.COMM_WORLD
    saved = (basics._COMM[0], basics._LOCAL[0])
    basics._COMM[0] = basics._LOCAL[0] = None
    try:
        assert (ct.rank(), ct.size(), ct.is_initialized()) == (world.rank, world.size, False)
        with pytest.raises(ValueError, match=r"local_rank\(\) needs collectives.torch.init\(\)"):
            ct.local_rank()
        ct.init()
        node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
        assert (ct.local_rank(), ct.local_size()) == (node.rank, node.size)
        node.Free()
        half = world.Split(world.rank % 2, world.rank)  # two groups (one at p = 1)
        ct.init(half)
        assert (ct.rank(), ct.size()) == (half.rank, half.size) and ct.is_initialized()
        assert ct.local_size() == half.size  # one node here
        y = ct.allreduce(torch.full((3,), float(world.rank)), op="sum")  # on half, by default
        members = [r for r in range(world.size) if r % 2 == world.rank % 2]
        assert torch.equal(y, torch.full((3,), float(sum(members))))
        ct.init()
        half.Free()
    finally:
        basics._COMM[0], basics._LOCAL[0] = saved


def test_out_of_place_allreduce_leaves_its_input_and_is_differentiable():
    comm = MPI.COMM_WORLD
    p = comm.size
    t = torch.arange(5, dtype=torch.float32) + comm.rank
    before = t.clone()
    y = ct.allreduce(t, name="t")  # Horovod's default: the average
    assert torch.equal(t, before) and y.data_ptr() != t.data_ptr()
    assert torch.allclose(y, torch.arange(5, dtype=torch.float32) + (p - 1) / 2)
    s = ct.allreduce(t, op="max")
    assert torch.equal(s, torch.arange(5, dtype=torch.float32) + p - 1) and not s.requires_grad
    for op, expected in (("sum", float(p)), ("avg", 1.0)):
        x = torch.ones(4, requires_grad=True)
        out = ct.allreduce(x * (comm.rank + 1), op=op)
        assert out.requires_grad
        out.sum().backward()  # d(out_i)/d(x_i of each rank): the same reduction of ones
        assert torch.equal(x.grad, torch.full((4,), (comm.rank + 1) * expected)), (op, x.grad)


def test_horovod_compression_names_and_a_hint_to_codec():
    comm = MPI.COMM_WORLD
    t = torch.linspace(-1, 1, 7) * (comm.rank + 1)
    fp16 = ct.allreduce(t, compression=ct.Compression.fp16)
    assert torch.equal(fp16, ct.allreduce(t, codec="fp16"))
    assert torch.equal(ct.allreduce(t, compression=ct.Compression.none), ct.allreduce(t))
    with pytest.raises(TypeError, match="codec='topk:ratio=0.01'"):
        ct.allreduce(t, compression=object())
    with pytest.raises(ValueError, match="not both"):
        ct.allreduce(t, codec="fp16", compression=ct.Compression.fp16)
    model = torch.nn.Linear(3, 2)
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  model.named_parameters(), compression=ct.Compression.fp16)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    with pytest.raises(TypeError, match="pass codec="):
        ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                compression="horovod.Compression.fp16".split)


def test_horovod_spellings_of_broadcast_and_ops():
    comm = MPI.COMM_WORLD
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.fill_(comm.rank)
    root = comm.size - 1
    ct.broadcast_parameters(model.state_dict(), root_rank=root)
    assert torch.equal(model.weight, torch.full((2, 2), float(root)))
    t = torch.full((3,), float(comm.rank + 1))
    assert torch.equal(ct.allreduce(t, op=ct.Sum), ct.allreduce(t, op="sum"))
    assert torch.equal(ct.allreduce(t, op=ct.Average), ct.allreduce(t))


def test_timeline_names_the_buckets(tmp_path):
    """A DistributedOptimizer step under collectives.timeline: every parameter's bucket appears
    by name (``collectives.torch.grad.<name>``) among the requests of every rank, in a merged
    file that passes the trace-event checks."""
    from collectives.diagnostics import timeline

    comm = MPI.COMM_WORLD
    path = comm.bcast(str(tmp_path / "run.json"), root=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    opt = ct.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), bucket_bytes=1)
    timeline.start(path)
    model(torch.ones(3, 8) * (comm.rank + 1)).sum().backward()
    opt.step()
    written = timeline.stop()
    opt.remove_hooks()
    if comm.rank == 0:
        doc = timeline.chrome.read(written)
        timeline.check(doc)
        want = {"collectives.torch.grad." + n for n, _ in model.named_parameters()}
        for r in range(comm.size):
            names = {e["args"]["name"] for e in doc["traceEvents"]
                     if e["pid"] == r and e.get("cat") == "request" and "name" in e["args"]}
            assert want <= names, (r, want - names)
    comm.Barrier()


@pytest.mark.parametrize("graph", ["full", "one_peer_exponential", "ring"])
def test_neighbor_optimizer_mixes_the_locally_stepped_parameters(graph):
    """DistributedNeighborAllreduceOptimizer: each rank steps on its own gradients, then its
    parameters become its row of the mixing matrix applied to every rank's stepped parameters
    (the reference: plain optimizers, all ranks' parameters gathered, W @ X); over 3 steps of a
    graph that changes every step. On the full graph the replicas agree (to rounding: each rank
    adds the terms in its own order)."""
    from collectives.decentralized import topology

    comm = MPI.COMM_WORLD
    p = comm.size
    graph_of = getattr(topology, graph)(p)
    x, y, xl, yl = _data(comm)
    m, ref = _model(), _model()
    opt = ct.DistributedNeighborAllreduceOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), graph_of, comm=comm)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        for model, o in ((m, opt), (ref, ref_opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(model(xl), yl).backward()
            o.step()
        stepped = gather_all(_np(_flat(ref)).astype(np.float64), comm)
        mixed = graph_of.weights(step)[comm.rank] @ stepped
        with torch.no_grad():  # the reference continues from the mixed parameters
            torch.nn.utils.vector_to_parameters(torch.from_numpy(mixed).float(), ref.parameters())
        assert np.allclose(_np(_flat(m)), mixed, rtol=1e-5, atol=1e-6), (graph, step)
    if graph == "full":
        everyone = gather_all(_np(_flat(m)), comm)
        assert np.allclose(everyone, everyone[0], rtol=1e-6, atol=1e-7)
    assert opt.state_dict()["collectives.neighbor_rounds"] == 3
    with pytest.raises(ValueError):
        ct.DistributedNeighborAllreduceOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                                 topology.ring(p + 1), comm=comm)
