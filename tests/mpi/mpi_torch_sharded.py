"""Sharded data parallelism in collectives.torch: ShardedOptimizer (ZeRO 1-2) and fully_shard (3).

Each configuration against a one-process run over the global batch (each rank a slice of it):
parameters to float32 rounding after several steps (``assert_close`` with rtol 1e-5 and atol
1e-6: the reduction sums the ranks' gradients in another order than one process's batch mean),
and bitwise identical across ranks after every step (stage 1-2: the parameters; stage 3: the
gathered full state dict). Optimizer state per rank is counted (numel) against the unsharded
optimizer's: the padded block, 1/p. Parameter counts that do not divide by p, several dtypes
(float32 and float64 buckets), a module without parameters, p = 1 (world size 1). Consolidated
optimizer state against the reference optimizer's and reloaded; the full state dict into a plain
module gives the same loss. Bad input raises on every rank before any message.

``param_codec=`` on ShardedOptimizer (world sizes 1, 2, 3, 5): the masters and parameters against a
dense ShardedOptimizer whose parameters the test rounds (bit for bit) and against a one-process
run with rounded parameters and float32 masters (the test's docstring states how closely), and
stop and resume through the consolidated state's masters, bit for bit.
"""

import compress
import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
import collectives.torch as ct  # noqa: E402

# plumbing over reduce-scatter/allgather, which mpi_allreduce.py and mpi_blocks.py check at
# every size: one rank, two, and an odd number (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3)

torch.set_num_threads(1)
TOL = dict(rtol=1e-5, atol=1e-6)
BATCH = 840  # divides by every world size 1-8
OPTIMIZERS = {"sgd-momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
              "adam": (torch.optim.Adam, dict(lr=0.01))}


class Net(torch.nn.Module):
    """Two float32 layers (7*13+13 and 13*3+3 elements: neither divides by 2 or 3) and a float64
    scale of 3 elements (fewer than some p): two dtypes, two buckets at least."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(7, 13)
        self.act = torch.nn.ReLU()  # no parameters
        self.fc2 = torch.nn.Linear(13, 3)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64))

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))).double() * self.scale


def _net(seed=0):
    torch.manual_seed(seed)
    return Net()


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 7, generator=g), torch.randn(BATCH, 3, generator=g).double()


def _local(x, comm):
    n = BATCH // comm.size
    return x[comm.rank * n:(comm.rank + 1) * n]


def _loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def _step(model, opt, x, y):
    """One optimizer step of ``model`` on the batch ``(x, y)``."""
    opt.zero_grad()
    _loss(model, x, y).backward()
    opt.step()


def _identical(tensors, comm):
    mine = b"".join(t.detach().contiguous().numpy().tobytes() for t in tensors)
    return len(set(comm.allgather(mine))) == 1


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "overlap"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2])
def test_sharded_optimizer_equals_one_process(stage, optimizer, overlap):
    comm = MPI.COMM_WORLD
    cls, kw = OPTIMIZERS[optimizer]
    x, y = _data()
    ref, model = _net(), _net(seed=comm.rank)  # other ranks' values: rank 0's are broadcast
    ref_opt = cls(ref.parameters(), **kw)
    opt = ct.ShardedOptimizer(model.parameters(), cls, stage=stage, overlap=overlap,
                              bucket_bytes=256, **kw)  # several buckets per dtype
    for _ in range(4):
        _step(ref, ref_opt, x, y)
        _step(model, opt, _local(x, comm), _local(y, comm))
        assert _identical(list(model.parameters()), comm)
        for a, b in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, **TOL)
        if stage == 2:
            assert all(q.grad is None for q in model.parameters())
    # optimizer state: this rank's padded blocks only, 1/p of the unsharded optimizer's
    per_rank = sum(t.numel() for s in opt.optim.state.values() for t in s.values()
                   if torch.is_tensor(t) and t.dim() > 0)
    full = sum(t.numel() for s in ref_opt.state.values() for t in s.values()
               if torch.is_tensor(t) and t.dim() > 0)
    entries = 1 if optimizer == "sgd-momentum" else 2
    blocks = sum(b.layout.chunk for b in opt._buckets)
    assert per_rank == entries * blocks
    assert per_rank <= full / comm.size + entries * len(opt._buckets)


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking", "overlap"])
def test_sharded_optimizer_stage1_exchange(overlap):
    """Stage 1 runs stage 2's exchange (a reduce-scatter of the gradients, then the parameters'
    allgather): the same parameters bit for bit after every step; ``p.grad`` keeps this rank's
    own gradient (what backward wrote, unchanged by step()), while stage 2 frees it. With
    ``average_grads=True`` the parameters are again the same bits, and ``p.grad`` is the
    averaged gradient: bitwise the same on every rank, the one-process gradient to float32
    rounding (as DDP leaves it)."""
    comm = MPI.COMM_WORLD
    cls, kw = OPTIMIZERS["adam"]
    x, y = _data()
    ref = _net()
    ref_opt = cls(ref.parameters(), **kw)
    models = {name: _net() for name in ("stage 1", "stage 2", "stage 1, average_grads")}
    opts = {name: ct.ShardedOptimizer(m.parameters(), cls, stage=1 if "1" in name else 2,
                                      average_grads="average" in name, overlap=overlap,
                                      bucket_bytes=256, **kw) for name, m in models.items()}
    xs, ys = _local(x, comm), _local(y, comm)
    for _ in range(3):
        ref_opt.zero_grad()
        _loss(ref, x, y).backward()
        want = [q.grad.clone() for q in ref.parameters()]
        ref_opt.step()
        for name, m in models.items():
            opts[name].zero_grad()
            _loss(m, xs, ys).backward()
            own = [None if q.grad is None else q.grad.clone() for q in m.parameters()]
            opts[name].step()
            got = list(m.parameters())
            if name == "stage 1":
                assert all(g is not None and torch.equal(q.grad, g) for q, g in zip(got, own)), \
                    "stage 1 leaves p.grad as backward wrote it"
            elif name == "stage 2":
                assert all(q.grad is None for q in got)
            else:
                grads = [q.grad for q in got]
                assert _identical(grads, comm)
                for g, w in zip(grads, want):
                    torch.testing.assert_close(g, w, **TOL)
        first = list(models["stage 1"].parameters())
        for name in ("stage 2", "stage 1, average_grads"):
            assert all(torch.equal(a, b) for a, b in zip(first, models[name].parameters())), \
                name
        assert _identical(first, comm)
        for a, b in zip(first, ref.parameters()):
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("stage", [1, 2])
def test_sharded_optimizer_state_dict(stage):
    """The consolidated state is the unsharded optimizer's (to float32 rounding); loaded into a
    new ShardedOptimizer, the next step is bitwise the original's."""
    comm = MPI.COMM_WORLD
    cls, kw = OPTIMIZERS["adam"]
    x, y = _data()
    ref, model = _net(), _net()
    ref_opt = cls(ref.parameters(), **kw)
    opt = ct.ShardedOptimizer(model.parameters(), cls, stage=stage, bucket_bytes=256, **kw)
    for _ in range(3):
        _step(ref, ref_opt, x, y)
        _step(model, opt, _local(x, comm), _local(y, comm))
    to = comm.size - 1
    opt.consolidate_state_dict(to=to)
    if comm.rank == to:
        sd = opt.state_dict()
        want = ref_opt.state_dict()
        assert sd["param_groups"][0]["lr"] == want["param_groups"][0]["lr"]
        assert set(sd["state"]) == set(want["state"])
        for i, entries in want["state"].items():
            for key, value in entries.items():
                torch.testing.assert_close(sd["state"][i][key], value, **TOL)
        plain = cls(_net().parameters(), **kw)
        plain.load_state_dict(sd)  # loads into the unsharded optimizer
    else:
        with pytest.raises(RuntimeError, match="consolidate_state_dict"):
            opt.state_dict()
        sd = None
    sd = comm.bcast(sd, root=to)
    twin = _net()
    twin.load_state_dict(model.state_dict())
    opt2 = ct.ShardedOptimizer(twin.parameters(), cls, stage=stage, bucket_bytes=256, **kw)
    opt2.load_state_dict(sd)
    for m, o in ((model, opt), (twin, opt2)):
        _step(m, o, _local(x, comm), _local(y, comm))
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


PARAM_CODECS = ("bf16", "fp16")


def _round(t, codec):
    """``t`` rounded to bfloat16 (``"bf16"``) or binary16 (``"fp16"``), nearest even, in its own
    dtype again: the codec's decoded values (float64 to binary16 through NumPy's correctly
    rounded cast, as the codec; torch's float64 to float16 cast rounds twice)."""
    t = t.detach()
    if codec == "bf16":
        return t.to(torch.bfloat16).to(t.dtype)
    return torch.from_numpy(t.numpy().astype(np.float16).astype(t.numpy().dtype))


class _RoundedOneProcess:
    """The one-process reference of a parameter codec: the optimizer steps full-precision
    masters (float32, and float64 for the float64 scale) over the global batch, and the model
    computes with the masters rounded to the codec's dtype (from the start, then after every
    step); the gradient of the rounded parameters is the masters' gradient."""

    def __init__(self, cls, kw, codec):
        self.masters, self.model, self.codec = _net(), _net(), codec
        self.opt = cls(self.masters.parameters(), **kw)
        self._place()

    def _place(self):
        with torch.no_grad():
            for m, q in zip(self.masters.parameters(), self.model.parameters()):
                q.copy_(_round(m, self.codec))

    def step(self, x, y):
        self.model.zero_grad()
        _loss(self.model, x, y).backward()
        for m, q in zip(self.masters.parameters(), self.model.parameters()):
            m.grad = q.grad.clone()
        self.opt.step()
        self._place()


def _round_in_place(model, codec):
    with torch.no_grad():
        for q in model.parameters():
            q.copy_(_round(q, codec))


# 5: a bucket of fewer elements than ranks (blocks of padding only) and one that p divides; 4
# would add no case 2 and 5 do not cover (tested with --mpi-every-size), for a launch's cost
@pytest.mark.world_sizes(1, 2, 3, 5)
@pytest.mark.parametrize("codec", PARAM_CODECS)
@pytest.mark.parametrize("stage,optimizer", [(1, "sgd-momentum"), (2, "adam")])
def test_sharded_optimizer_param_codec_rounds_the_masters(stage, optimizer, codec):
    """``param_codec=`` at stage 1 and 2, p = 1, 2, 3, 5 (buckets of 55, 91 and 3 elements:
    91 divides by none of them, 55 by 5, 3 is fewer than 5 ranks). The equivalence: a ShardedOptimizer
    with a parameter codec is a dense one whose parameters are rounded to the codec's dtype
    after construction and after every step while its shards (the masters) stay full precision;
    the test checks it bit for bit, masters and buckets, after every step (the same reductions of
    the same gradients), and that the parameters are the rounded masters, bitwise the same on
    every rank. Against the one-process reference (:class:`_RoundedOneProcess`): bit for bit at
    p = 1 (the same arithmetic); at p > 1 the ranks' gradients are summed in another order than
    one process's batch mean, so the masters agree to float32 rounding (rtol 1e-5, atol 1e-6)
    and the parameters to one unit in the codec's last place (relative 2^-7 for bf16, 2^-10 for
    fp16: a master within float32 rounding of a rounding boundary may round the other way)."""
    comm = MPI.COMM_WORLD
    cls, kw = OPTIMIZERS[optimizer]
    x, y = _data()
    model, twin = _net(seed=comm.rank), _net(seed=comm.rank)  # rank 0's are broadcast
    opt = ct.ShardedOptimizer(model.parameters(), cls, stage=stage, param_codec=codec,
                              bucket_bytes=256, **kw)
    dense = ct.ShardedOptimizer(twin.parameters(), cls, stage=stage, bucket_bytes=256, **kw)
    _round_in_place(twin, codec)
    ref = _RoundedOneProcess(cls, kw, codec)
    ulp = {"bf16": 2.0 ** -7, "fp16": 2.0 ** -10}[codec]
    for _ in range(3):
        _step(model, opt, _local(x, comm), _local(y, comm))
        _step(twin, dense, _local(x, comm), _local(y, comm))
        _round_in_place(twin, codec)
        ref.step(x, y)
        params = list(model.parameters())
        assert _identical(params, comm)
        for b, d in zip(opt._buckets, dense._buckets):
            assert torch.equal(b.shard, d.shard)  # the masters
            assert torch.equal(b.flat, d.flat)
            assert torch.equal(b.flat[b.layout.lo:b.layout.hi], _round(b.shard, codec))
        for a, r in zip(params, ref.model.parameters()):
            if comm.size == 1:
                assert torch.equal(a, r)
            else:
                torch.testing.assert_close(a, r, rtol=ulp, atol=1e-6)
    assert any(not torch.equal(b.shard, _round(b.shard, codec)) for b in opt._buckets), \
        "the masters keep what the rounding drops"
    opt.consolidate_state_dict(to=0)
    if comm.rank == 0:
        masters = opt.state_dict()["master"]
        for i, r in enumerate(ref.masters.parameters()):
            if comm.size == 1:
                assert torch.equal(masters[i], r)
            else:
                torch.testing.assert_close(masters[i], r.detach(), **TOL)


@pytest.mark.parametrize("codec", PARAM_CODECS)
@pytest.mark.parametrize("stage", [1, 2])
def test_sharded_optimizer_param_codec_resumes_bitwise(stage, codec):
    """With ``param_codec=`` the consolidated state carries the masters (which the model's own
    state dict, holding the rounded parameters, does not): a new ShardedOptimizer over a model
    loaded from the rounded parameters, given that state, takes the original's next steps bit
    for bit, masters and parameters; an unsharded optimizer still loads the state."""
    comm = MPI.COMM_WORLD
    cls, kw = OPTIMIZERS["adam"]
    x, y = _data()
    model = _net()
    opt = ct.ShardedOptimizer(model.parameters(), cls, stage=stage, param_codec=codec,
                              bucket_bytes=256, **kw)
    for _ in range(2):
        _step(model, opt, _local(x, comm), _local(y, comm))
    to = comm.size - 1
    opt.consolidate_state_dict(to=to)
    sd = opt.state_dict() if comm.rank == to else None
    if comm.rank == to:
        rounded = list(model.parameters())
        assert set(sd["master"]) == set(range(len(rounded)))
        assert any(not torch.equal(sd["master"][i], q) for i, q in enumerate(rounded))
        cls(_net().parameters(), **kw).load_state_dict(sd)
    sd = comm.bcast(sd, root=to)
    twin = _net(seed=7)
    twin.load_state_dict(model.state_dict())  # the rounded parameters
    opt2 = ct.ShardedOptimizer(twin.parameters(), cls, stage=stage, param_codec=codec,
                               bucket_bytes=256, **kw)
    short = {**sd, "master": {i: m for i, m in sd["master"].items() if i != 1}}
    with pytest.raises(ValueError, match="'master' entry"):  # checked before anything loads
        opt2.load_state_dict(short)
    assert not opt2.optim.state
    opt2.load_state_dict(sd)
    for _ in range(2):
        for m, o in ((model, opt), (twin, opt2)):
            _step(m, o, _local(x, comm), _local(y, comm))
        for a, b in zip(opt._buckets, opt2._buckets):
            assert torch.equal(a.shard, b.shard) and torch.equal(a.flat, b.flat)
    assert _identical(list(twin.parameters()), comm)


class Root(torch.nn.Module):
    """An MLP of Linear+ReLU blocks (each its own unit) and a float64 scale that the root's unit
    holds (a second dtype, 3 elements)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.ReLU(),
                                        torch.nn.Linear(13, 5), torch.nn.ReLU(),
                                        torch.nn.Linear(5, 3))
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64))

    def forward(self, x):
        return self.body(x).double() * self.scale


def _root(seed=0):
    torch.manual_seed(seed)
    return Root()


def _sharded_root(comm, seed, prefetch, codec=None, **kw):
    model = _root(seed)
    for layer in model.body:  # ReLU too: a unit without parameters
        ct.fully_shard(layer, comm=comm, prefetch=prefetch, codec=codec, **kw)
    ct.fully_shard(model.body, comm=comm, prefetch=prefetch, codec=codec, **kw)
    ct.fully_shard(model, comm=comm, prefetch=prefetch, codec=codec, **kw)
    return model


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "no-prefetch"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_fully_shard_equals_one_process(optimizer, prefetch):
    comm = MPI.COMM_WORLD
    cls, kw = OPTIMIZERS[optimizer]
    x, y = _data()
    ref = _root()
    model = _sharded_root(comm, seed=comm.rank, prefetch=prefetch)
    shards = list(model.parameters())
    assert sorted(q.numel() for q in shards) == sorted(
        -(-n // comm.size) for n in [7 * 13 + 13, 13 * 5 + 5, 5 * 3 + 3, 3])
    ref_opt, opt = cls(ref.parameters(), **kw), cls(shards, **kw)
    for _ in range(4):
        _step(ref, ref_opt, x, y)
        _step(model, opt, _local(x, comm), _local(y, comm))
        full = ct.full_state_dict(model)
        assert _identical([full[k] for k in sorted(full)], comm)
        want = ref.state_dict()
        assert set(full) == set(want)
        for k in want:
            torch.testing.assert_close(full[k], want[k], **TOL)
    # nothing gathered is held between steps
    units = [m._collectives_fully_shard for m in model.modules()
             if hasattr(m, "_collectives_fully_shard")]
    assert len(units) == 7
    assert all(f.full.untyped_storage().nbytes() == 0 for u in units for f in u.flats)
    # the full state dict into a plain module gives the sharded model's loss
    plain = _root(seed=5)
    plain.load_state_dict(ct.full_state_dict(model))
    with torch.no_grad():
        assert torch.equal(_loss(plain, x, y), _loss(model, x, y))


def test_fully_shard_load_full_state_dict():
    comm = MPI.COMM_WORLD
    src = _root(seed=3)
    model = _sharded_root(comm, seed=0, prefetch=True)
    ct.load_full_state_dict(model, src.state_dict())
    full = ct.full_state_dict(model)
    for k, v in src.state_dict().items():
        assert torch.equal(full[k], v)
    with pytest.raises(KeyError, match="missing"):
        ct.load_full_state_dict(model, {})


@pytest.mark.parametrize("which", ["sharded_optimizer", "fully_shard"])
def test_codec_identical_across_ranks(which):
    """A codec in the gradients' reduce: every rank ends with the same parameters, close to the
    dense run's (fp16 rounding of the gradients)."""
    comm = MPI.COMM_WORLD
    x, y = _data()
    if which == "fully_shard":
        model = _sharded_root(comm, seed=0, prefetch=True, codec="fp16")
        dense = _sharded_root(comm, seed=0, prefetch=True)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, dense)]
    else:
        model, dense = _net(), _net()
        opts = [ct.ShardedOptimizer(model.parameters(), torch.optim.SGD, codec="fp16", lr=0.1),
                ct.ShardedOptimizer(dense.parameters(), torch.optim.SGD, lr=0.1)]
    for _ in range(3):
        for m, o in zip((model, dense), opts):
            _step(m, o, _local(x, comm), _local(y, comm))
    got = (ct.full_state_dict(model) if which == "fully_shard"
           else dict(model.named_parameters()))
    want = (ct.full_state_dict(dense) if which == "fully_shard"
            else dict(dense.named_parameters()))
    assert _identical([got[k] for k in sorted(got)], comm)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-2, atol=1e-3)


def test_fully_shard_param_codec_bf16():
    """bf16 parameters in the allgather: every rank computes with the same decoded parameters
    (bitwise, the owner's included), the shards stay float32 masters (the optimizer's updates
    below bf16's resolution are kept), and training follows the dense run within bf16's
    rounding."""
    comm = MPI.COMM_WORLD
    x, y = _data()
    model = _net()
    dense = _net()
    for m, codec in ((model, "bf16"), (dense, None)):
        for layer in (m.fc1, m.fc2):
            ct.fully_shard(layer, comm=comm, param_codec=codec)
        ct.fully_shard(m, comm=comm, param_codec=codec)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, dense)]
    for _ in range(3):
        for m, o in zip((model, dense), opts):
            _step(m, o, _local(x, comm), _local(y, comm))
    shards = [q.detach() for q in model.parameters()]
    assert any(not torch.equal(q, q.to(torch.bfloat16).to(q.dtype)) for q in shards), \
        "the shards are float32 masters, not bf16 values"
    seen = []  # the parameters a forward computes with: decoded from bf16, the same everywhere
    hook = model.fc1.register_forward_pre_hook(
        lambda mod, args: seen.append(mod.weight.detach().clone()))
    with torch.no_grad():
        model(_local(x, comm))
    hook.remove()
    w = seen[0]
    assert torch.equal(w, w.to(torch.bfloat16).to(w.dtype)), "computes with bf16 values"
    assert _identical([w], comm)
    got, want = ct.full_state_dict(model), ct.full_state_dict(dense)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("which", ["sharded_optimizer", "fully_shard"])
def test_bfloat16_residuals_identical_across_ranks(which):
    """``residual_dtype="bfloat16"`` with top-k and error feedback: the residuals are stored as
    bfloat16 words (two bytes an element); every rank ends with the same parameters, near the
    float32 residuals' run and not the same bits."""
    comm = MPI.COMM_WORLD
    x, y = _data()
    codec = "topk:ratio=0.3"
    if which == "fully_shard":
        model = _sharded_root(comm, seed=0, prefetch=True, codec=codec,
                              residual_dtype="bfloat16")
        wide = _sharded_root(comm, seed=0, prefetch=True, codec=codec)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, wide)]
        states = [getattr(m, "_collectives_fully_shard").codec_state for m in model.modules()
                  if getattr(m, "_collectives_fully_shard", None) is not None]
    else:
        model, wide = _net(), _net()
        opts = [ct.ShardedOptimizer(model.parameters(), torch.optim.SGD, codec=codec,
                                    residual_dtype="bfloat16", lr=0.1),
                ct.ShardedOptimizer(wide.parameters(), torch.optim.SGD, codec=codec, lr=0.1)]
        states = [opts[0]._codec_state]
    for _ in range(4):
        for m, o in zip((model, wide), opts):
            _step(m, o, _local(x, comm), _local(y, comm))
    residuals = [r.error for st in states for r in st.memory.state.values()]
    assert residuals and all(e.dtype == torch.uint16 or str(e.dtype) == "uint16"
                             for e in residuals)
    got = (ct.full_state_dict(model) if which == "fully_shard"
           else dict(model.named_parameters()))
    want = (ct.full_state_dict(wide) if which == "fully_shard"
            else dict(wide.named_parameters()))
    assert _identical([got[k] for k in sorted(got)], comm)
    assert any(not torch.equal(got[k], want[k]) for k in want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0.05, atol=0.02)


BAD = {
    "stage 3": (lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD, stage=3, lr=0.1),
                ValueError, "stage 1 or 2"),
    "stage 0": (lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD, stage=0, lr=0.1),
                ValueError, "stage 1 or 2"),
    "average_grads at stage 2": (
        lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD, stage=2,
                                      average_grads=True, lr=0.1),
        ValueError, "average_grads=True goes with stage=1"),
    "not an optimizer": (lambda m: ct.ShardedOptimizer(m.parameters(), dict, lr=0.1),
                         TypeError, "optimizer_class"),
    "low-rank codec": (lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD,
                                                     codec="powersgd", lr=0.1),
                       ValueError, "flat"),
    "codec object": (lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD, codec=3,
                                                   lr=0.1), TypeError, "codec"),
    "not a module": (lambda m: ct.fully_shard(list(m.parameters())), TypeError, "nn.Module"),
    "fully_shard low-rank codec": (lambda m: ct.fully_shard(m, codec="powersgd"), ValueError,
                                   "flat"),
    "param_codec low-rank": (lambda m: ct.fully_shard(m, param_codec="powersgd"), ValueError,
                             "factors a matrix"),
    "twice": (lambda m: ct.fully_shard(ct.fully_shard(m)), ValueError, "already"),
    "param_codec topk": (lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD,
                                                       param_codec="topk:ratio=0.1", lr=0.1),
                         ValueError, "ShardedOptimizer: param_codec .*keeps only some elements"),
    "param_codec signs": (lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD,
                                                        param_codec="signsgd", lr=0.1),
                          ValueError, "aggregates by majority"),
    "param_codec random": (lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD,
                                                         param_codec="qsgd", lr=0.1),
                           ValueError, "rounds at random"),
    "param_codec low-rank (ShardedOptimizer)": (
        lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD, param_codec="powersgd",
                                      lr=0.1), ValueError, "factors a matrix"),
    "param_codec unknown": (lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD,
                                                          param_codec="nosuch", lr=0.1),
                            ValueError, "ShardedOptimizer: param_codec 'nosuch'"),
    "param_codec of bfloat16 parameters": (
        lambda m: ct.ShardedOptimizer([torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))],
                                      torch.optim.SGD, param_codec="bf16", lr=0.1),
        ValueError, "does not take bfloat16 parameters"),
    "fully_shard param_codec topk": (lambda m: ct.fully_shard(m, param_codec="topk"),
                                     ValueError, "fully_shard: param_codec .*keeps only some"),
    "residual dtype without error feedback": (
        lambda m: ct.ShardedOptimizer(m.parameters(), torch.optim.SGD, codec="fp16",
                                      residual_dtype="bfloat16", lr=0.1),
        ValueError, "no error feedback"),
    "residual dtype of a codec object": (
        lambda m: ct.fully_shard(m, codec=compress.get("topk"), residual_dtype="float16"),
        ValueError, "codec spec"),
    "unknown residual dtype": (
        lambda m: ct.fully_shard(m, codec="topk", residual_dtype="int8"), ValueError,
        "residual_dtype must be one of"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_on_every_rank(case):
    make, exc, match = BAD[case]
    model = _net()
    before = [q.detach().clone() for q in model.parameters()]
    with pytest.raises(exc, match=match):
        make(model)
    if case != "twice":  # nothing was changed
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # every rank raised: the communicator still pairs the next collective
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.size


def test_sharded_optimizer_frozen_parameters_stay():
    """A parameter that does not require grad is left out (torch.optim never steps it)."""
    comm = MPI.COMM_WORLD
    x, y = _data()
    model = _net()
    model.fc1.weight.requires_grad_(False)
    frozen = model.fc1.weight.detach().clone()
    opt = ct.ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, weight_decay=0.1)
    for _ in range(2):
        _step(model, opt, _local(x, comm), _local(y, comm))
    assert torch.equal(model.fc1.weight, frozen)
    assert sum(b.layout.total for b in opt._buckets) == sum(
        q.numel() for q in model.parameters() if q.requires_grad)
