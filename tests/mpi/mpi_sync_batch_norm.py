"""``hvd.SyncBatchNorm`` against one process's ``torch.nn.BatchNorm1d/2d`` on the whole batch.

Every rank builds the same global batch (one seed); rank ``r`` holds rows ``r + 2`` of it (sizes
differ per rank). The loss is ``sum over ranks of (y * w).sum()`` with fixed per-sample weights
``w``, each rank backpropagating its own part: the output of its rows, their input gradient, the
running statistics after the step, and the affine gradients summed over ranks must equal the
reference's, and eval mode must be plain batch norm with the running statistics.
"""

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
import collectives.torch as hvd  # noqa: E402

pytestmark = pytest.mark.world_sizes(1, 2, 4)
torch.set_num_threads(1)

SHAPES = {"2d": (3, 4, 5), "1d": (3,)}  # (C, *) after the batch dimension
REFERENCE = {"2d": torch.nn.BatchNorm2d, "1d": torch.nn.BatchNorm1d}


def _rows(rank):
    start = sum(r + 2 for r in range(rank))
    return slice(start, start + rank + 2)


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("momentum", [0.1, None])
def test_sync_batch_norm_matches_batch_norm_on_the_whole_batch(kind, momentum):
    hvd.init()
    p, r = MPI.COMM_WORLD.size, MPI.COMM_WORLD.rank
    n = sum(q + 2 for q in range(p))
    gen = torch.Generator().manual_seed(1234)
    shape = (n, *SHAPES[kind])
    x = torch.randn(shape, generator=gen) * 3 + 100  # a mean large against the spread
    w = torch.randn(shape, generator=gen)
    c = shape[1]
    gamma, beta = torch.randn(c, generator=gen), torch.randn(c, generator=gen)

    ref = REFERENCE[kind](c, momentum=momentum)
    bn = hvd.SyncBatchNorm(c, momentum=momentum)
    with torch.no_grad():
        for m in (ref, bn):
            m.weight.copy_(gamma)
            m.bias.copy_(beta)
    xr = x.clone().requires_grad_()
    (ref(xr) * w).sum().backward()
    mine = x[_rows(r)].clone().requires_grad_()
    y = bn(mine)
    (y * w[_rows(r)]).sum().backward()

    tol = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y, _train_output(ref, x, gamma, beta, momentum)[_rows(r)], **tol)
    torch.testing.assert_close(mine.grad, xr.grad[_rows(r)], **tol)
    torch.testing.assert_close(bn.running_mean, ref.running_mean, **tol)
    torch.testing.assert_close(bn.running_var, ref.running_var, **tol)
    assert int(bn.num_batches_tracked) == int(ref.num_batches_tracked) == 1
    # affine gradients are this rank's share; the optimizer's allreduce sums them
    for mp, rp in ((bn.weight, ref.weight), (bn.bias, ref.bias)):
        torch.testing.assert_close(hvd.allreduce(mp.grad, op=hvd.Sum), rp.grad, **tol)

    bn.eval()
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(bn(x[_rows(r)]), ref(x[_rows(r)]), **tol)


def _train_output(ref, x, gamma, beta, momentum):
    """The reference's training-mode output on the whole batch, running statistics untouched."""
    fresh = type(ref)(ref.num_features, momentum=momentum)
    with torch.no_grad():
        fresh.weight.copy_(gamma)
        fresh.bias.copy_(beta)
        return fresh(x)


def test_sync_batch_norm_on_a_process_set_and_without_affine():
    """A set of the even ranks normalizes over their samples only; affine=False and
    track_running_stats=False (batch statistics in eval mode too, the set's, as Horovod's)."""
    hvd.init()
    p, r = MPI.COMM_WORLD.size, MPI.COMM_WORLD.rank
    evens = hvd.add_process_set(list(range(0, p, 2)))
    try:
        if r % 2:
            return
        members = list(range(0, p, 2))
        gen = torch.Generator().manual_seed(7)
        parts = [torch.randn(q + 2, 3, 4, generator=gen) for q in members]
        whole = torch.cat(parts)
        bn = hvd.SyncBatchNorm(3, affine=False, track_running_stats=False, process_set=evens)
        ref = torch.nn.BatchNorm1d(3, affine=False, track_running_stats=False)
        start = sum(len(t) for t in parts[:members.index(r)])
        expected = ref(whole)[start:start + r + 2]
        torch.testing.assert_close(bn(parts[members.index(r)]), expected, rtol=1e-4, atol=1e-4)
        bn.eval()
        torch.testing.assert_close(bn(parts[members.index(r)]), expected, rtol=1e-4, atol=1e-4)
        assert bn.running_mean is None and bn.weight is None
    finally:
        hvd.remove_process_set(evens)
