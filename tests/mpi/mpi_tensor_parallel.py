"""Tensor parallelism (Megatron-LM's MLP split): the split block and the split MLP against the
unsplit ones computed in one process, the replicas of a ``tp`` group bitwise identical, dp x tp
meshes with singleton axes, the driver's ``--tensor``, the PyTorch layers against
``torch.nn.Linear``, and bad arguments failing on every rank.

Tolerance: the row-parallel output and the column-parallel input gradient sum ``T`` partial
products in another order than one matrix product does; float32 results are compared with
``rtol = 1e-5`` and ``atol = 1e-5`` times the reference's largest magnitude (float32's epsilon
is 1.2e-7: the widths here sum at most a few dozen products). ``T = 1`` is bitwise the unsplit
layer.
"""

import hashlib

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.parallel.tensor import ColumnParallelLinear, RowParallelLinear, he_init
from collectives.sgd.model import MLP
from collectives.sgd.tensor_parallel import TensorParallelMLP

# The layers are plumbing over the allreduce (checked at every size elsewhere): every dp x tp
# factorisation of 1-4 ranks, singleton axes included (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3, 4)

WORLD = MPI.COMM_WORLD
D, HIDDEN, B = 12, 24, 8  # HIDDEN: divisible by T = 1, 2, 3, 4


def _meshes(p):
    """Every (dp, tp) shape of p ranks."""
    return [(p // t, t) for t in range(1, p + 1) if p % t == 0]


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def _same_on(comm, *arrays):
    digest = hashlib.blake2b(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).digest()
    assert len(set(comm.allgather(digest))) == 1


def _gather_cols(a, comm):
    """The column blocks of every rank of ``comm``, side by side."""
    return np.concatenate(comm.allgather(a), axis=-1)


def _gather_rows(a, comm):
    return np.concatenate(comm.allgather(a), axis=0)


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "native"])
def test_block_matches_the_unsplit_block(algorithm):
    """Forward and backward of relu(x A + a) B + b, split T ways on the tp axis of every mesh,
    against the same block unsplit in one process."""
    rng = np.random.default_rng(1)
    a_w, b_w = he_init(D, HIDDEN, rng), he_init(HIDDEN, D, rng)
    a_b, b_b = rng.standard_normal(HIDDEN, np.float32), rng.standard_normal(D, np.float32)
    x, dy = rng.standard_normal((B, D), np.float32), rng.standard_normal((B, D), np.float32)
    # the unsplit block
    z = x @ a_w + a_b
    h = np.maximum(z, 0)
    y = h @ b_w + b_b
    dh = (dy @ b_w.T) * (z > 0)
    want = {"y": y, "dx": dh @ a_w.T, "dA": x.T @ dh, "da": dh.sum(0), "dB": h.T @ dy,
            "db": dy.sum(0)}
    for shape in _meshes(WORLD.size):
        with collectives.Mesh(shape, ("dp", "tp")) as mesh:
            tp = mesh.comm("tp")
            col = ColumnParallelLinear(D, HIDDEN, mesh, weight=a_w, bias=a_b, algorithm=algorithm)
            row = RowParallelLinear(HIDDEN, D, tp, weight=b_w, bias=b_b, algorithm=algorithm)
            assert col.weight.shape == (D, HIDDEN // shape[1])
            assert row.weight.shape == (HIDDEN // shape[1], D) and row.bias.shape == (D,)
            # the shards concatenate to the unsplit weights, bit for bit
            assert np.array_equal(_gather_cols(col.weight, tp), a_w)
            assert np.array_equal(_gather_rows(row.weight, tp), b_w)
            zr = col.forward(x)
            hr = np.maximum(zr, 0)
            got_y = row.forward(hr)
            dx = col.backward(row.backward(dy.copy()) * (zr > 0))
            got = {"y": got_y, "dx": dx, "dA": _gather_cols(col.weight_grad, tp),
                   "da": _gather_cols(col.bias_grad, tp), "dB": _gather_rows(row.weight_grad, tp),
                   "db": row.bias_grad}
            for k, v in want.items():
                if shape[1] == 1:  # one rank on the axis: the unsplit arithmetic
                    assert np.array_equal(got[k], v), (shape, k)
                else:
                    _close(got[k], v)
            _same_on(tp, got_y, dx, row.bias_grad)  # what follows the block is replicated


def _steps(model, comm_dp, sizes, steps, lr=0.1):
    """Plain SGD steps on the batches of this dp replica, gradients averaged over ``comm_dp``."""
    rng = np.random.default_rng(7)
    for _ in range(steps):
        x = rng.standard_normal((comm_dp.size, B, sizes[0]), np.float32)
        y = rng.integers(0, sizes[-1], (comm_dp.size, B))
        model.loss_and_grad(x[comm_dp.rank], y[comm_dp.rank])
        collectives.allreduce(model.grads.flat, out=model.grads.flat, op="avg", comm=comm_dp)
        model.params.flat[...] -= np.float32(lr) * model.grads.flat


def _reference(sizes, dp, steps, lr=0.1):
    """The same steps in one process: one MLP on the global batches (the replicas' batches, of
    equal sizes: the mean over the global batch is the mean of their means)."""
    model = MLP(sizes, seed=3)
    rng = np.random.default_rng(7)
    for _ in range(steps):
        x = rng.standard_normal((dp, B, sizes[0]), np.float32)
        y = rng.integers(0, sizes[-1], (dp, B))
        model.loss_and_grad(x.reshape(dp * B, -1), y.reshape(-1))
        model.params.flat[...] -= np.float32(lr) * model.grads.flat
    return model


@pytest.mark.parametrize("sizes", [(D, HIDDEN, HIDDEN, 5), (D, HIDDEN, 36, 12, 5)],
                         ids=["one-pair", "pair-and-unpaired"])
def test_sgd_steps_match_one_process(sizes):
    """Five SGD steps of the split MLP on every dp x tp mesh: the gathered parameters equal the
    one-process model's on the global batches; logits bitwise identical across the tp group;
    with dp = tp = 1 every bit is the MLP's."""
    steps = 5
    for dp, t in _meshes(WORLD.size):
        with collectives.Mesh((dp, t), ("dp", "tp")) as mesh:
            model = TensorParallelMLP(sizes, mesh.comm("tp"), seed=3)
            assert model.kinds[:2] == ["column", "row"] and model.kinds[-1] == "replicated"
            assert np.array_equal(model.full_params(), MLP(sizes, seed=3).params.flat)
            _steps(model, mesh.comm("dp"), sizes, steps)
            ref = _reference(sizes, dp, steps)
            full = model.full_params()
            if (dp, t) == (1, 1):
                assert np.array_equal(full, ref.params.flat)
            else:
                _close(full, ref.params.flat)
            x = np.random.default_rng(9).standard_normal((B, sizes[0]), np.float32)
            _same_on(mesh.comm("tp"), model.logits(x))
            _same_on(mesh.comm(), full)  # every replica holds the same model


def test_bad_arguments_fail_on_every_rank():
    """A wrong weight shape, a width below one: the same ValueError on every rank, before any
    message (the next call still works)."""
    p = WORLD.size
    with pytest.raises(ValueError, match="weight must be the unsplit"):
        RowParallelLinear(p, 3, WORLD, weight=np.zeros((p, 4), np.float32))
    with pytest.raises(ValueError, match="positive int"):
        ColumnParallelLinear(0, p, WORLD)
    layer = ColumnParallelLinear(4, 2 * p, WORLD)
    assert layer.forward(np.ones((1, 4), np.float32)).shape == (1, 2)


@pytest.mark.mpi(min_size=2)
def test_widths_the_axis_does_not_divide_fail_on_every_rank():
    """A width the axis size does not divide, widths that differ between ranks: the same
    ValueError on every rank (the differing one: every rank learns of rank 0's)."""
    p = WORLD.size
    with pytest.raises(ValueError, match=f"tensor-parallel size {p} does not divide "
                                         f"out_features = {p + 1}"):
        ColumnParallelLinear(4, p + 1, WORLD)
    with pytest.raises(ValueError, match=f"does not divide in_features = {2 * p + 1}"):
        RowParallelLinear(2 * p + 1, 3, WORLD)
    with pytest.raises(ValueError):  # rank 0 alone passes another width
        ColumnParallelLinear(4, p * (2 if WORLD.rank else 3), WORLD)
    layer = RowParallelLinear(2 * p, 3, WORLD)
    assert layer.forward(np.ones((1, 2), np.float32)).shape == (1, 3)


TINY = ["--subset", "96", "--epochs", "1", "--hidden", "24,24,12", "--batch-size", "4",
        "--quiet"]


def test_driver_tensor_matches_data_parallelism_over_the_replicas(tmp_path_factory):
    """``--tensor T`` on p ranks trains as data parallelism on p / T ranks does: the saved
    (gathered) parameters equal theirs to float32 rounding, every bit with T = 1; the replicas
    of every dp group stay identical (``--check-replicas``)."""
    from collectives.sgd import datasets, train

    folder = WORLD.bcast(str(tmp_path_factory.mktemp("tp")) if WORLD.rank == 0 else None)
    for dp, t in _meshes(WORLD.size):
        split = f"{folder}/tp{t}.npy"
        s = train([*TINY, "--tensor", str(t), "--check-replicas", "--save-params", split], WORLD)
        assert s["mesh"] == {"dp": dp, "pp": 1, "tp": t} and s["tensor"] == t
        # one forward allreduce of B x 24 per step (the first pair needs no input gradient) and
        # one of the evaluated test samples of this replica's share; the ring sends 2 (T-1)/T
        # of each
        tested = len(datasets.load("digits").y_test[WORLD.rank // t::dp])
        assert s["tp_comm"][1] == 2 * (t - 1) * (s["steps"] * 4 + tested) * 24 * 4 // t
        assert s["axes"]["pp"]["bytes_max"] == 0  # one stage: nothing between stages
        sub = WORLD.Split(0 if WORLD.rank < dp else MPI.UNDEFINED, WORLD.rank)
        plain = f"{folder}/dp{dp}.npy"
        if sub != MPI.COMM_NULL:
            train([*TINY, "--save-params", plain], sub)
            sub.Free()
        WORLD.Barrier()
        got, want = np.load(split), np.load(plain)
        if t == 1:
            assert np.array_equal(got, want)
        else:
            _close(got, want)


def test_driver_tensor_resume_is_bitwise(tmp_path_factory):
    """A --tensor run stopped after a checkpoint and resumed ends with the same bits as one that
    never stopped (every rank's shard and momentum in the checkpoint)."""
    from collectives.sgd import main, train

    folder = WORLD.bcast(str(tmp_path_factory.mktemp("tpck")) if WORLD.rank == 0 else None)
    args = [*TINY, "--epochs", "2", "--checkpoint-dir", folder]
    train([*args, "--tensor", str(WORLD.size), "--save-params", f"{folder}/whole.npy"], WORLD)
    args += ["--tensor", str(WORLD.size)]
    assert train([*args, "--checkpoint-every", "3", "--stop-after", "4"], WORLD) is None
    if WORLD.size > 1:  # another split: refused on every rank (the fingerprint differs)
        assert main([*args[:-1], "1", "--resume"], WORLD) == 2
    train([*args, "--resume", "--save-params", f"{folder}/resumed.npy"], WORLD)
    WORLD.Barrier()
    assert np.array_equal(np.load(f"{folder}/whole.npy"), np.load(f"{folder}/resumed.npy"))


def test_driver_refuses_bad_tensor_arguments_on_every_rank():
    """A T that does not divide the world or a hidden width, an option it does not take: exit
    code 2 on every rank, before any message (rank 0 prints the one line)."""
    from collectives.sgd import main

    p = WORLD.size
    bad = [["--tensor", str(p + 1)], ["--tensor", str(p), "--hidden", f"{2 * p + 1},8"],
           ["--tensor", "1", "--sync", "local:2"], ["--tensor", "1", "--overlap"]]
    if p == 1:
        bad.pop(1)  # every width is a multiple of 1
    for extra in bad:
        assert main([*TINY, *extra], WORLD) == 2, extra


# torch's import costs seconds in every job: 4 ranks alone, whose meshes 4 x 1, 2 x 2, 1 x 4 hold
# the axis sizes 1, 2 and 4 (the NumPy layers below them run at 1-4 ranks)
@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("bias", [True, False])
def test_torch_layers_match_nn_linear(bias):
    """collectives.torch.parallel's pair against two nn.Linear on the full weights, on every
    dp x tp mesh: outputs, the input's gradient and the gathered weight gradients."""
    torch = pytest.importorskip("torch")
    from collectives.torch.parallel import ColumnParallelLinear as Col, RowParallelLinear as Row

    torch.set_num_threads(1)  # ranks are processes: OpenMP threads of several fight for cores
    torch.manual_seed(5)
    first, second = torch.nn.Linear(D, HIDDEN, bias=bias), torch.nn.Linear(HIDDEN, D, bias=bias)
    x = torch.randn(B, D)
    dy = torch.randn(B, D)
    xr = x.clone().requires_grad_()
    (torch.relu(first(xr)) @ second.weight.T + (second.bias if bias else 0)).mul(dy).sum() \
        .backward()
    want = [second(torch.relu(first(x))).detach(), xr.grad, first.weight.grad,
            second.weight.grad]
    for shape in _meshes(WORLD.size):
        with collectives.Mesh(shape, ("dp", "tp")) as mesh:
            tp = mesh.comm("tp")
            col = Col.from_linear(first, mesh, algorithm="recursive_doubling")
            row = Row.from_linear(second, tp)
            assert col.weight.shape == (HIDDEN // shape[1], D)
            assert (row.bias is not None) == bias
            xs = x.clone().requires_grad_()
            y = row(torch.relu(col(xs)))
            (y * dy).sum().backward()
            got = [y.detach(), xs.grad,
                   torch.from_numpy(_gather_rows(col.weight.grad.numpy(), tp)),
                   torch.from_numpy(_gather_cols(row.weight.grad.numpy(), tp))]
            for g, w in zip(got, want):
                _close(g.numpy(), w.numpy())
            if bias:
                _close(_gather_cols(col.bias.grad.numpy(), tp), first.bias.grad.numpy())
                _close(row.bias.grad.numpy(), second.bias.grad.numpy())
            _same_on(tp, y.detach().numpy(), xs.grad.numpy())
            # the constructor: the shard of the nn.Linear the same random state builds
            torch.manual_seed(11)
            built = Col(D, HIDDEN, tp, bias=bias)
            torch.manual_seed(11)
            full = torch.nn.Linear(D, HIDDEN, bias=bias)
            assert torch.equal(torch.from_numpy(_gather_rows(built.weight.detach().numpy(), tp)),
                               full.weight.detach())


@pytest.mark.world_sizes(4)
def test_torch_layers_refuse_a_width_the_axis_does_not_divide():
    torch = pytest.importorskip("torch")
    from collectives.torch.parallel import ColumnParallelLinear as Col, RowParallelLinear as Row

    p = WORLD.size
    with pytest.raises(ValueError, match=f"does not divide out_features = {p + 1}"):
        Col(4, p + 1, WORLD)
    with pytest.raises(ValueError, match=f"does not divide in_features = {p + 1}"):
        Row.from_linear(torch.nn.Linear(p + 1, 3), WORLD)
    assert Row(2 * p, 3, WORLD)(torch.ones(1, 2)).shape == (1, 3)
