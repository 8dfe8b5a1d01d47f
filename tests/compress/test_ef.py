"""Error-feedback SGD on least squares, 4 simulated workers, reaches the uncompressed loss."""

from __future__ import annotations

import numpy as np
import pytest

import compress

WORKERS, ROWS, DIM, STEPS = 4, 1000, 100, 2000


def problem(seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((WORKERS, ROWS, DIM)) / np.sqrt(DIM)
    w_true = rng.standard_normal(DIM)
    b = a @ w_true + 0.5 * rng.standard_normal((WORKERS, ROWS))
    return a, b


def loss(a, b, w):
    r = a @ w - b
    return 0.5 * np.mean(r * r)


def train(a, b, codec=None, memory=None, lr_factor=1.0):
    """Final loss of data-parallel GD with step ``lr_factor / L`` decaying linearly to zero."""
    hess = sum(a[i].T @ a[i] for i in range(WORKERS)) / (WORKERS * ROWS)
    lr = lr_factor / np.linalg.eigvalsh(hess).max()
    w = np.zeros(DIM)
    for step in range(STEPS):
        grads = [a[i].T @ (a[i] @ w - b[i]) / ROWS for i in range(WORKERS)]
        if codec is None:
            update = np.mean(grads, axis=0)
        else:
            decoded = [memory[i].decode(memory[i].encode(g, key="w", step=step)) for i, g in enumerate(grads)]
            update = codec.aggregate(decoded)
        w -= lr * (1.0 - step / STEPS) * update  # linear decay removes EF's noise floor
    return loss(a, b, w)


@pytest.mark.parametrize("name,params", [
    ("topk", {"ratio": 0.01}),
    ("efsignsgd", {}),
    ("qsgd", {"levels": 15, "bucket": 64, "seed": 0}),
    ("onebit", {}),
    ("dgc", {"density": 0.05, "seed": 0}),
])
def test_error_feedback_sgd_reaches_uncompressed_loss(name, params):
    a, b = problem()
    reference = train(a, b)
    codec = compress.get(name, **params)
    memory = [compress.ErrorFeedback(codec) for _ in range(WORKERS)]
    got = train(a, b, codec, memory, lr_factor=0.25)  # EF with top-k diverges at step 1/L
    assert got <= 1.01 * reference, (got, reference)


def test_dgc_memory_momentum_correction_converges():
    a, b = problem(1)
    reference = train(a, b)
    codec = compress.get("topk", ratio=0.05)
    memory = [compress.DGCMemory(codec, momentum=0.5) for _ in range(WORKERS)]
    got = train(a, b, codec, memory, lr_factor=0.1)
    assert got <= 1.01 * reference, (got, reference)


@pytest.mark.parametrize("name,params", [("topk", {"ratio": 0.01}), ("threshold", {"tau": 1.0}),
                                         ("dgc", {"density": 0.01, "seed": 2}),
                                         ("efsignsgd", {}), ("qsgd", {"seed": 1})])
def test_residual_is_compensated_input_minus_decoded(name, params):
    """The sparse shortcut and the dense path keep the same residual: c - decode(payload)."""
    ef = compress.ErrorFeedback(compress.get(name, **params))
    rng = np.random.default_rng(4)
    residual = np.zeros(5000, np.float32)
    for step in range(3):
        x = rng.standard_normal(5000).astype(np.float32)
        corrected = x + residual
        payload = ef.encode(x, key="k", step=step)
        residual = corrected - ef.codec.decode(payload)
        np.testing.assert_array_equal(ef.residual("k"), residual)
