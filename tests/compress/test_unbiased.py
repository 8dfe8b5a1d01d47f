"""Unbiased codecs: the mean of many decodes converges to the input within a statistical bound."""

from __future__ import annotations

import numpy as np
import pytest

import compress

TRIALS = 3000


def mean_decode(codec, x, keyed=False):
    acc = np.zeros(x.size)
    for t in range(TRIALS):
        acc += codec.decode(codec.encode(x, key="w", step=t))
    return acc / TRIALS


@pytest.mark.parametrize("name,params,max_step", [
    ("qsgd", {"levels": 1, "bucket": 16, "seed": 0}, lambda x: np.linalg.norm(x.reshape(-1, 16), axis=1).repeat(16)),
    ("qsgd", {"levels": 4, "bucket": 64, "seed": 1}, lambda x: np.linalg.norm(x.reshape(-1, 64), axis=1).repeat(64) / 4),
    ("terngrad", {"seed": 2}, lambda x: np.full(x.size, np.abs(x).max())),
    ("natural", {"seed": 3}, lambda x: np.abs(x)),
])
def test_stochastic_rounding_is_unbiased(name, params, max_step):
    x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    codec = compress.get(name, **params)
    assert codec.unbiased
    err = mean_decode(codec, x) - x
    # per element: rounding between two points `step` apart has std <= step / 2
    bound = 6 * (max_step(x) / 2) / np.sqrt(TRIALS) + 1e-6
    assert np.all(np.abs(err) <= bound)
    assert abs(err.mean()) < 6 * np.mean(max_step(x) / 2) / np.sqrt(TRIALS * x.size)


def test_scaled_randomk_is_unbiased():
    x = np.random.default_rng(1).standard_normal(200)
    codec = compress.get("randomk", ratio=0.1, seed=5, unbiased_scaling=True)
    assert codec.unbiased and not compress.get("randomk").unbiased
    err = mean_decode(codec, x) - x
    std = np.abs(x) * np.sqrt(200 / 20 - 1)  # per element: x * (d/k) * Bernoulli(k/d)
    assert np.all(np.abs(err) <= 6 * std / np.sqrt(TRIALS))


def test_unscaled_randomk_and_qsgd_seeds_reproduce():
    x = np.random.default_rng(2).standard_normal(100).astype(np.float32)
    a, b = compress.get("qsgd", levels=3, seed=9), compress.get("qsgd", levels=3, seed=9)
    for _ in range(3):
        np.testing.assert_array_equal(a.encode(x), b.encode(x))
    assert not np.array_equal(a.encode(x), a.encode(x))
