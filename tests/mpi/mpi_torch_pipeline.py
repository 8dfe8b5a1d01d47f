"""collectives.torch.pipelining: PipelineStage, ScheduleGPipe and Schedule1F1B over an
nn.Sequential cut into one stage per rank give the parameters of the whole model trained in one
process on the same batches (the mean of the micro-batches' losses), and the last stage's
outputs and losses."""

import copy

import pytest
from mpi4py import MPI

from collectives.parallel.pipeline import balanced

torch = pytest.importorskip("torch")

# two stages and an odd number (docs/testing.md); one rank is the NumPy tests' (mpi_pipeline.py)
pytestmark = pytest.mark.world_sizes(2, 3)

WORLD = MPI.COMM_WORLD
M = 4
#: the largest parameter difference from the one-process model after 3 steps (float32; the
#: same operations, the gradient of each micro-batch added in the same order)
ATOL = 1e-6


def _units():
    torch.manual_seed(0)
    widths = [6, 8, 8, 7, 5, 3]  # 5 linear layers: no S of 2 or 3 divides them
    units = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        units.append([torch.nn.Linear(a, b)] + ([torch.nn.ReLU()] if i < len(widths) - 2 else []))
    return units


@pytest.mark.parametrize("name", ["ScheduleGPipe", "Schedule1F1B"])
def test_pipeline_matches_one_process(name):
    import collectives.torch.pipelining as pipelining

    S, r = WORLD.size, WORLD.rank
    units = _units()
    reference = torch.nn.Sequential(*copy.deepcopy([m for u in units for m in u]))
    bounds = balanced([1] * len(units), S)
    mine = torch.nn.Sequential(*[m for u in units[bounds[r]:bounds[r + 1]] for m in u])
    stage = pipelining.PipelineStage(mine, r, S)
    schedule = getattr(pipelining, name)(stage, M, loss_fn=torch.nn.functional.cross_entropy)
    opt = torch.optim.SGD(mine.parameters(), lr=0.5, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    try:
        for _ in range(3):
            x, y = torch.randn(10, 6, generator=g), torch.randint(0, 3, (10,), generator=g)
            opt.zero_grad()
            losses = []
            if stage.is_last:
                out = schedule.step(*([x] if stage.is_first else []), target=y, losses=losses)
            else:
                out = schedule.step(*([x] if stage.is_first else []))
            opt.step()
            ref_opt.zero_grad()
            ref_losses = [torch.nn.functional.cross_entropy(reference(a), b)
                          for a, b in zip(torch.tensor_split(x, M), torch.tensor_split(y, M))]
            (sum(ref_losses) / M).backward()
            if stage.is_last:
                assert out.shape == (10, 3) and len(losses) == M
                for a, b in zip(losses, ref_losses):
                    assert abs(float(a) - float(b)) < 1e-5
            else:
                assert out is None
            ref_opt.step()
    finally:
        schedule.close()
    ref_params = dict(reference.named_parameters())
    offset = sum(len(u) for u in units[:bounds[r]])  # index of this stage's first module
    names = [k for k, _ in mine.named_parameters()]
    assert len(names) == 2 * (bounds[r + 1] - bounds[r])  # a weight and a bias per layer
    for k, p in mine.named_parameters():
        i, _, kind = k.partition(".")
        q = ref_params[f"{int(i) + offset}.{kind}"]
        assert not torch.equal(q, dict(torch.nn.Sequential(
            *[m for u in _units() for m in u]).named_parameters())[f"{int(i) + offset}.{kind}"])
        assert torch.allclose(p, q, atol=ATOL, rtol=0), (k, (p - q).abs().max())


def test_a_stage_of_the_wrong_rank_is_refused():
    import collectives.torch.pipelining as pipelining

    with pytest.raises(ValueError, match="the group's rank must be the stage"):
        pipelining.PipelineStage(torch.nn.Linear(2, 2), (WORLD.rank + 1) % (WORLD.size + 1),
                                 WORLD.size)
