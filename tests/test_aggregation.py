"""Aggregating p payloads into one dense sum (collectives/compressed/coding.TensorCoding) against
the dense reference, bit for bit, in one process.

The reference decodes every payload to a dense vector and adds them in rank order with NumPy
(``acc = d_0`` in at least float32, ``acc += d_r``): what every strategy computed before sparse
payloads were added at their indices. The sums must be the same bits, including the elements
where NumPy's ``+ 0.0`` of a rank that sent nothing changes something (``-0.0``, signalling NaN),
NaNs met in either order, and the mean.
"""

from __future__ import annotations

import numpy as np
import pytest

import compress
from collectives.compressed.coding import TensorCoding
from collectives.compressed._sparsevec import SparseVec, combine

DTYPES = [np.float32, np.float64, np.float16]
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
SNAN = {2: 0x7C01, 4: 0x7F800001, 8: 0x7FF0000000000001}
QNAN = {2: 0x7E01, 4: 0x7FC00001, 8: 0x7FF8000000000001}


def dense_reference(codec, payloads, count, average, world):
    decoded = [codec.decode(pl, count=count).reshape(-1) for pl in payloads]
    with np.errstate(over="ignore", invalid="ignore"):
        acc = decoded[0].astype(np.result_type(decoded[0].dtype, np.float32), copy=True)
        for d in decoded[1:]:
            acc += d
        if average:
            acc /= world
    return acc


def contributions(p, n, dtype, seed):
    """p tensors whose sent indices overlap: large values, infinities and NaNs (quiet and
    signalling, a payload per rank) at shared indices, and zeros of both signs that a dense top-k
    sends (ties go to the lowest index)."""
    rng = np.random.default_rng(seed)
    xs = []
    for r in range(p):
        x = rng.standard_normal(n).astype(dtype)
        x[n // 16:] = 0.0
        x[n // 16 + r % 3::3] = -0.0
        x[6:16] = 1000
        x[0] = -0.0 if r < p - 1 else 1000  # -0.0 + -0.0 + ... stays -0.0 until the last rank
        x[1] = -0.0 if r == 0 else 1000
        x[2] = -0.0 if r % 2 == 0 else 0.0
        u = x.view(UINT[x.itemsize])
        u[3] = SNAN[x.itemsize] + r
        u[4] = QNAN[x.itemsize] + r
        x[5] = np.inf if r % 2 else -np.inf
        xs.append(x)
    return xs


@pytest.mark.parametrize("average", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("spec", ["topk:ratio=0.01", "topk:ratio=0.5", "threshold:tau=1.0",
                                  "dgc:density=0.02,seed=1", "efsignsgd", "randomk:ratio=0.1"])
def test_sum_of_payloads_is_the_dense_sum(spec, p, dtype, average):
    codec = compress.from_spec(spec)
    n = 1031
    payloads = []
    for r, x in enumerate(contributions(p, n, dtype, seed=p)):
        with np.errstate(over="ignore", invalid="ignore"):
            payloads.append(codec.encode(x, key="k", step=1))
    want = dense_reference(codec, payloads, n, average, p)
    coding = TensorCoding(compress_state(codec), "k", 1, average, p, (n,))
    for out_dtype in {want.dtype, np.dtype(dtype)}:  # the sum's own dtype: summed in place
        out = np.empty(n, dtype=out_dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            coding.aggregate_into(payloads, n, out)
            expected = want.astype(out_dtype)
        np.testing.assert_array_equal(out.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("p", [1, 3, 4])
@pytest.mark.parametrize("spec", ["topk:ratio=0.01", "threshold:tau=1.0"])
def test_a_sum_over_many_chunks_streamed_at_any_alignment(spec, p, dtype, monkeypatch):
    """Past one chunk, with the result streamed past the caches (the size threshold lowered to
    0) into arrays that start at every offset from a 64-byte boundary: the same bits."""
    from compress import stream

    from collectives.compressed._kernels import CHUNK

    monkeypatch.setattr(stream, "STREAM_MIN_BYTES", 0)
    codec = compress.from_spec(spec)
    n = 2 * CHUNK + 1031
    payloads = []
    for x in contributions(p, n, dtype, seed=p):
        x[CHUNK - 3:CHUNK + 5] = 1000  # sent across a chunk boundary
        with np.errstate(over="ignore", invalid="ignore"):
            payloads.append(codec.encode(x, key="k", step=1))
    want = dense_reference(codec, payloads, n, True, p)
    coding = TensorCoding(compress_state(codec), "k", 1, True, p, (n,))
    itemsize = want.itemsize
    for offset in range(0, 64 // itemsize, 3):
        raw = np.empty(n * itemsize + 128, np.uint8)
        start = -raw.ctypes.data % 64 + offset * itemsize
        out = raw[start:start + n * itemsize].view(want.dtype)
        assert stream.streaming(out) == (-offset % (64 // itemsize), True)
        with np.errstate(over="ignore", invalid="ignore"):
            coding.aggregate_into(payloads, n, out)
        np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))


def test_sparse_payloads_add_at_their_indices_only():
    """The sparse path writes one dense vector: no dense decode per payload."""
    codec = compress.get("topk", ratio=0.01)
    payloads = [codec.encode(x) for x in contributions(4, 100_000, np.float32, seed=0)]
    calls = []
    original = type(codec).decode
    type(codec).decode = lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
    try:
        coding = TensorCoding(compress_state(codec), "k", 0, True, 4, (100_000,))
        coding.aggregate_into(payloads, 100_000, np.empty(100_000, np.float32))
    finally:
        type(codec).decode = original
    assert calls == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_combine_reuses_buffers_and_keeps_the_bits(dtype):
    """SparCML's combine adds into a dense operand's own buffer, in rank order."""
    rng = np.random.default_rng(3)
    n = 500
    lower = SparseVec(0, n, np.dtype(dtype), dense=rng.standard_normal(n).astype(dtype))
    idx = np.sort(rng.choice(n, 40, replace=False))
    higher = SparseVec(0, n, np.dtype(dtype), idx, rng.standard_normal(40).astype(dtype))
    want = lower.dense.copy()
    want[idx] = want[idx] + higher.vals
    buf = lower.dense
    got = combine(lower, higher)
    assert got.dense is buf
    np.testing.assert_array_equal(got.dense, want)
    a = SparseVec(0, n, np.dtype(dtype), dense=rng.standard_normal(n).astype(dtype))
    b = SparseVec(0, n, np.dtype(dtype), dense=rng.standard_normal(n).astype(dtype))
    want = a.dense + b.dense
    got = combine(a, b)
    assert got.dense is a.dense
    np.testing.assert_array_equal(got.dense, want)


def compress_state(codec):
    from collectives.compressed.state import CompressionState

    return CompressionState(codec)
