"""The Numba fast path of every codec against the plain-NumPy references in ``naive.py``."""

from __future__ import annotations

import numpy as np
import pytest

import compress
import naive
from helpers import DTYPES, parts, sample

SIZES = [0, 1, 7, 9, 100, 4097, 300_001]

EXACT = {
    "none": ({}, naive.ref_none),
    "fp16": ({}, naive.ref_fp16),
    "bf16": ({}, naive.ref_bf16),
    "topk": ({"ratio": 0.01}, naive.ref_topk),
    "threshold": ({"tau": 1.5}, naive.ref_threshold),
    "signsgd": ({}, naive.ref_signsgd),
    "efsignsgd": ({}, naive.ref_efsignsgd),
    "onebit": ({}, naive.ref_onebit),
    "natural": ({"seed": 1}, naive.ref_natural),
    "randomk": ({"ratio": 0.05, "seed": 3, "unbiased_scaling": True}, naive.ref_randomk),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(EXACT))
def test_matches_reference_bit_for_bit(name, n, dtype):
    params, ref = EXACT[name]
    codec = compress.get(name, **params)
    x = sample(n, dtype, seed=n)
    payload = codec.encode(x)
    hdr, _ = parts(codec, payload)
    got = codec.decode(payload)
    want = ref(x, hdr.params)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("k_ratio", [0.001, 0.01, 0.3, 1.0])
def test_topk_large_and_ties(k_ratio):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(1 << 19).astype(np.float32)
    x[::7] = 0.5  # many exact ties at one magnitude
    x[::11] = -0.5
    codec = compress.get("topk", ratio=k_ratio)
    payload = codec.encode(x)
    _, body = parts(codec, payload)
    np.testing.assert_array_equal(body["indices"], naive.ref_topk_indices(x, naive.k_for(x.size, k_ratio)))


def test_topk_keeps_the_k_largest_magnitudes():
    x = np.random.default_rng(3).permutation(np.arange(1, 10001, dtype=np.float64)) * np.where(
        np.arange(10000) % 2, 1.0, -1.0
    )
    y = compress.get("topk", ratio=0.01).decode(compress.get("topk", ratio=0.01).encode(x))
    kept = np.sort(np.abs(y[y != 0]))
    np.testing.assert_array_equal(kept, np.arange(9901, 10001, dtype=np.float64))


def test_topk_adversarial_all_equal():
    x = np.ones(1 << 19, dtype=np.float32)  # sampled threshold passes everything: fallback path
    y = compress.get("topk", ratio=0.001).decode(compress.get("topk", ratio=0.001).encode(x))
    k = naive.k_for(x.size, 0.001)
    np.testing.assert_array_equal(np.flatnonzero(y), np.arange(k))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name,params,use_max", [
    ("qsgd", {"levels": 127, "bucket": 512, "seed": 2}, False),
    ("qsgd", {"levels": 3, "bucket": 100, "seed": 2}, False),
    ("qsgd", {"levels": 1000, "bucket": 7, "seed": 2}, False),
    ("terngrad", {"seed": 2}, True),
    ("terngrad", {"bucket": 64, "seed": 2}, True),
    ("eightbit", {"bucket": 256}, True),
])
def test_levels_match_reference(name, params, use_max, n, dtype):
    codec = compress.get(name, **params)
    x = sample(n, dtype, seed=n + 1)
    payload = codec.encode(x)
    hdr, body = parts(codec, payload)
    s, bucket = hdr.params["levels"], hdr.params["bucket"]
    np.testing.assert_allclose(body["scales"], naive.ref_scales(x, bucket, use_max), rtol=1e-6)
    want = naive.ref_levels(x, body["scales"], s, bucket, name != "eightbit", hdr.params["stream"])
    np.testing.assert_array_equal(codec.decode(payload).view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_threshold_and_dgc_select_largest(dtype):
    x = sample(200_000, dtype, seed=9)
    codec = compress.get("dgc", density=0.001, seed=0)
    payload = codec.encode(x)
    hdr, body = parts(codec, payload)
    k = naive.k_for(x.size, 0.001)
    assert 0.75 * k <= hdr.params["nnz"] <= 1.25 * k
    y = codec.decode(payload)
    sent = y != 0
    np.testing.assert_array_equal(y[sent], x[sent])
    assert np.abs(x[sent]).min() >= np.abs(x[~sent]).max()


def test_randomk_indices_are_uniform_distinct_and_shared():
    n, codec = 50, compress.get("randomk", ratio=0.2, seed=7)
    counts = np.zeros(n)
    for step in range(4000):
        idx = codec.indices(n, key="w", step=step)
        assert idx.size == 10 and np.all(np.diff(idx) > 0) and idx[0] >= 0 and idx[-1] < n
        counts[idx] += 1
    expected = 4000 * 10 / n
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < 100  # 49 degrees of freedom: p < 1e-4 to fail by chance
    other = compress.get("randomk", ratio=0.2, seed=7)  # another "rank"
    np.testing.assert_array_equal(other.indices(n, key="w", step=3), codec.indices(n, key="w", step=3))
    assert not np.array_equal(codec.indices(n, key="w", step=3), codec.indices(n, key="w", step=4))
    assert not np.array_equal(codec.indices(n, key="w", step=3), codec.indices(n, key="v", step=3))


@pytest.mark.parametrize("scaled", [False, True])
def test_randomk_decodes_to_scaled_values(scaled):
    x = sample(1000, np.float32)
    codec = compress.get("randomk", ratio=0.05, seed=1, unbiased_scaling=scaled)
    y = codec.decode(codec.encode(x, key=3, step=5))
    idx = codec.indices(1000, key=3, step=5)
    scale = np.float32(1000 / 50) if scaled else np.float32(1)
    np.testing.assert_array_equal(y[idx], x[idx] * scale)
    assert np.count_nonzero(np.delete(y, idx)) == 0


@pytest.mark.parametrize("shape,rate,factored", [((40, 30), 2.0, True), ((7,), 2.0, False),
                                                 ((3, 4, 5), 2.0, False), ((3, 4, 5), 0.0, True)])
def test_powersgd_matches_reference(shape, rate, factored):
    """Factored tensors decode to the power step's P_hat Q^T, the others to themselves."""
    x = sample(int(np.prod(shape)), np.float64, shape=shape)
    codec = compress.get("powersgd", rank=2, seed=4, min_compression_rate=rate)
    assert codec.compresses(shape, np.float64) == factored
    y = codec.decode(codec.encode(x, key="k"))
    if factored:
        q0 = compress.get("powersgd", rank=2, seed=4)._current_q("k", (shape[0], x.size // shape[0]),
                                                                np.float64)
        np.testing.assert_allclose(y, naive.ref_powersgd(x, q0), atol=1e-10)
    else:
        np.testing.assert_array_equal(y, x)


def test_powersgd_allreduce_protocol_equals_sum():
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((20, 12)) for _ in range(3)]
    ranks = [compress.get("powersgd", rank=3, seed=1) for _ in grads]
    p = sum(c.compute_p(g, key="w") for c, g in zip(ranks, grads))
    p_hat = ranks[0].orthogonalize(p)
    q = sum(c.compute_q(g, p_hat) for c, g in zip(ranks, grads)) / 3
    outs = [c.reconstruct(p_hat, q, key="w", shape=(20, 12)) for c in ranks]
    mean = sum(grads) / 3
    single = compress.get("powersgd", rank=3, seed=1)
    np.testing.assert_allclose(outs[0], single.decode(single.encode(mean, key="w")), atol=1e-10)
    np.testing.assert_array_equal(outs[0], outs[2])


def test_uniform24_counters_past_2_32_draw_new_numbers():
    """Element i and element i + 2**32 of one stream get different random numbers (stochastic
    rounding of tensors over 4 G elements is not periodic), and the counters below 2**32 keep the
    formula of the reference (payloads written before stay decodable to the same values)."""
    from numba import njit

    from compress._kernels.rng import uniform24

    @njit
    def draws(start, n, lo, hi):
        out = np.empty(n, dtype=np.uint64)
        for j in range(n):
            out[j] = uniform24(np.uint64(start + j), lo, hi)
        return out

    stream = 0x0123456789ABCDEF
    lo, hi = stream & 0xFFFFFFFF, stream >> 32
    low = draws(0, 4096, lo, hi)
    np.testing.assert_array_equal(low, naive.uniform24(4096, stream))
    for k in (1, 2, 255):
        far = draws(k << 32, 4096, lo, hi)
        assert np.mean(far == low) < 0.01
        assert far.max() < 1 << 24


def test_powersgd_encode_keeps_q_without_the_full_size_product():
    """Encoding needs P_hat and Q only: its memory stays far below one tensor's size (forming
    P_hat Q^T to keep the warm start allocated a whole tensor and took 6-40x the time)."""
    import tracemalloc

    x = sample(1024 * 1024, np.float32, shape=(1024, 1024))
    codec = compress.get("powersgd", rank=1)
    first = codec.encode(x, key="w")
    tracemalloc.start()
    try:
        payload = codec.encode(x, key="w")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert payload.size == first.size == codec.payload_nbytes(x.shape)
    assert peak < x.nbytes / 16, peak
    np.testing.assert_array_equal(codec.state_dict()["w"].reshape(-1),
                                  parts(codec, payload)[1]["q"])  # the kept Q is the sent one


def test_fp16_summable_decode_is_numpys_cast():
    """The fp16 codec's summed values widen to float32 through its decode kernel: every binary16
    word (NaN payloads, signalling NaNs, subnormals, infinities) gives NumPy's cast's bits;
    float64 and other shapes take NumPy's cast itself."""
    codec = compress.from_spec("fp16")
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got = codec.summable_decode(words, shape=words.shape, dtype=np.float32)
    assert got.dtype == np.float32
    assert got.view(np.uint32).tobytes() == words.astype(np.float32).view(np.uint32).tobytes()
    wide = codec.summable_decode(words[:6], shape=(2, 3), dtype=np.float64)
    assert wide.shape == (2, 3) and wide.dtype == np.float64
    assert wide.tobytes() == words[:6].astype(np.float64).reshape(2, 3).tobytes()


def test_fp16_encode_words_for_every_exponent_and_rounding_case():
    """float32 to binary16 by the processor's conversion (the host kernel) gives, for every
    sign, exponent and top 7 mantissa bits (all 65536 upper halves) times low halves at and
    around each rounding boundary, the words of the integer-only conversion the device runs
    (``to_f16_word``: NaN as ``0x7E00`` with its sign), and NumPy's cast's words for every
    non-NaN input; a payload through the codec decodes to those values. (All 2**32 inputs were
    checked once the same way: docs/compression.md.)"""
    from numba import njit

    from compress._kernels import floats

    @njit
    def device_words(words, out):
        for i in range(words.size):
            out[i] = floats.to_f16_word(np.int64(words[i]), 23, 127)

    rng = np.random.default_rng(5)
    low = np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x17FF, 0x1800, 0x1FFF, 0x2000, 0x2001, 0x3000,
                    0x7FFF, 0x8000, 0xFFFF, *rng.integers(0, 1 << 16, 4)], np.uint32)
    words = ((np.arange(1 << 16, dtype=np.uint32)[:, None] << np.uint32(16)) | low).reshape(-1)
    x = words.view(np.float32)
    got = np.empty(x.size, np.uint16)
    floats.f32_to_f16_bits(x, words, got)
    want = np.empty(x.size, np.uint16)
    device_words(words, want)
    assert np.array_equal(got, want), words[got != want][:8]
    with np.errstate(over="ignore"):
        numpy = x.astype(np.float16).view(np.uint16)
    finite_or_inf = ~np.isnan(x)
    assert np.array_equal(got[finite_or_inf], numpy[finite_or_inf])
    nan = got[~finite_or_inf]
    assert set(np.unique(nan).tolist()) == {0x7E00, 0xFE00}
    codec = compress.from_spec("fp16")
    back = codec.decode(codec.encode(x))
    assert back.view(np.uint32).tobytes() == got.view(np.float16).astype(np.float32).view(
        np.uint32).tobytes()
