"""DGC as published (Lin et al. 2018): the sparsity warm-up and local gradient clipping of
``compress.DGCMemory`` against the plain-NumPy reference ``naive.ref_dgc_published``, bit for bit,
on the fused and the unfused path (issue 24, "The published methods, complete")."""

from __future__ import annotations

import numpy as np
import pytest

import compress
import naive
from helpers import DTYPES, sample

PAPER = [0.25, 0.0625, 0.015625, 0.00390625]  # 75 %, 93.75 %, 98.4375 %, 99.6 % sparsity


def test_the_default_warmup_is_the_papers():
    warmup = compress.SparsityWarmup(steps_per_stage=3)
    got = [warmup.density(step, 0.001) for step in range(18)]
    assert got == [d for d in PAPER for _ in range(3)] + [0.001] * 6
    # never sparser than the codec's own density; no stages: the codec's own from step 0
    assert [warmup.density(s, 0.01) for s in (0, 6, 9, 12)] == [0.25, 0.015625, 0.01, 0.01]
    assert compress.SparsityWarmup(5, stages=0).density(0, 0.001) == 0.001
    custom = compress.SparsityWarmup(2, stages=2, start=0.5, factor=0.1)
    assert [custom.density(s, 0.001) for s in range(6)] == [0.5, 0.5, 0.05, 0.05, 0.001, 0.001]


@pytest.mark.parametrize("kwargs, match", [
    ({"steps_per_stage": 0}, "steps_per_stage"), ({"steps_per_stage": 1.5}, "steps_per_stage"),
    ({"steps_per_stage": 1, "stages": -1}, "stages"),
    ({"steps_per_stage": 1, "start": 0.0}, "start"), ({"steps_per_stage": 1, "factor": 1.5}, "factor")])
def test_a_bad_warmup_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compress.SparsityWarmup(**kwargs)


def test_bad_memory_options_are_refused():
    warmup = compress.SparsityWarmup(1)
    with pytest.raises(ValueError, match="warmup needs a codec with a density"):
        compress.DGCMemory(compress.get("threshold", tau=1.0), warmup=warmup)
    with pytest.raises(TypeError, match="SparsityWarmup"):
        compress.DGCMemory(compress.get("topk"), warmup=[0.25, 0.1])
    for clip in (0.0, -1.0, float("inf"), float("nan"), "1"):
        with pytest.raises(ValueError, match="clip"):
            compress.DGCMemory(compress.get("topk"), clip=clip)
    with pytest.raises(ValueError, match="step"):
        compress.DGCMemory(compress.get("topk"), warmup=warmup).encode(np.ones(4), step=-1)


def _inputs(n, dtype):
    xs = [sample(n, dtype, seed=s) * dtype(1 + 3 * (s % 2)) for s in range(9)]
    if n > 2:
        xs[5][n // 2] = np.inf  # an overflowed step: sent as it is, the state stays
    return xs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 7, 65, 4097, 30_011])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("clip", [None, 1.0, 1e9])
def test_warmup_and_clipping_match_the_reference(n, dtype, fused, clip):
    warmup = compress.SparsityWarmup(steps_per_stage=2)
    memory = compress.DGCMemory(compress.get("topk", ratio=0.001), momentum=0.9, fused=fused,
                                warmup=warmup, clip=clip)
    xs = _inputs(n, dtype)
    originals = [x.copy() for x in xs]
    densities = [warmup.density(step, 0.001) for step in range(len(xs))]
    ref = naive.ref_dgc_published(xs, 0.9, densities, clip)
    for step, (g, (idx, values, u, v)) in enumerate(zip(xs, ref)):
        with np.errstate(over="ignore", invalid="ignore"):
            payload = memory.encode(g, key="k", step=step)
        got_idx, got_values = memory.codec.sparse_parts(payload, count=n)
        np.testing.assert_array_equal(got_idx, idx)
        np.testing.assert_array_equal(got_values.view(np.uint8), values.view(np.uint8))
        if n:
            np.testing.assert_array_equal(memory.state["k"].u.view(np.uint8), u.view(np.uint8))
            np.testing.assert_array_equal(memory.state["k"].v.view(np.uint8), v.view(np.uint8))
    for x, original in zip(xs, originals):  # clipping scaled a copy
        np.testing.assert_array_equal(x, original)


def test_clipping_bounds_what_one_step_adds():
    """One step from a zero state: the velocity is the clipped gradient, of norm ``clip``."""
    g = sample(10_000, np.float64, seed=3) * 100.0
    memory = compress.DGCMemory(compress.get("topk", ratio=1.0), momentum=0.0, clip=2.5)
    decoded = memory.codec.decode(memory.encode(g, key="k"))
    assert np.linalg.norm(decoded) == pytest.approx(2.5, rel=1e-12)
    np.testing.assert_allclose(decoded, g * (2.5 / np.linalg.norm(g)), rtol=1e-15)


def test_dgc_codec_follows_the_warmup():
    """DGC's sampled threshold sends about the scheduled density (0.75 k to 1.25 k, its rule)."""
    n = 200_000
    memory = compress.DGCMemory(compress.get("dgc", density=0.001, seed=1),
                                warmup=compress.SparsityWarmup(steps_per_stage=1))
    for step, d in enumerate(PAPER + [0.001, 0.001]):
        payload = memory.encode(sample(n, np.float32, seed=step), key="k", step=step)
        assert memory.codec.density == d
        k = naive.k_for(n, d)
        nnz = memory.codec.sparse_parts(payload, count=n)[0].size
        assert 0.75 * k <= nnz <= 1.25 * k, (step, nnz, k)
