"""The fused path of the memories (compress.protocols.FusedFeedback) against the unfused
reference, bit for bit.

``ErrorFeedback`` and ``DGCMemory`` around top-k, DGC, threshold and random-k compute what they
compress in the codec's selecting pass (``compress/_kernels/fused.py``). The references
(``naive.ref_error_feedback``, ``naive.ref_dgc_memory``) compute it with NumPy, encode it with the
codec's own ``encode`` and update the state from a dense ``decode``: the unfused path. Payload
bytes, residuals, momenta and velocities must be the same bits, for every dtype, sizes from 0 to
past the sampled selection, inputs that defeat the selection's estimates, and non-finite input
(docs/compression.md, "Non-finite input": the payload carries it, the state stays as it was).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

import compress
import naive
from compress.memory import ErrorFeedback
from compress.protocols import FusedFeedback
from helpers import DTYPES, parts, sample

SIZES = [0, 1, 7, 64, 65, 4097, 300_001]
CODECS = {
    "topk": {"ratio": 0.01},
    "topk-dense": ("topk", {"ratio": 0.4}),
    "dgc": {"density": 0.01, "seed": 3},
    "dgc-small-sample": ("dgc", {"density": 0.05, "sample_ratio": 0.001, "seed": 5}),
    "threshold": {"tau": 1.0},
    "randomk": {"ratio": 0.05, "seed": 1},
    "randomk-scaled": ("randomk", {"ratio": 0.05, "seed": 1, "unbiased_scaling": True}),
}
NAIVE = {"topk": naive.ref_topk, "threshold": naive.ref_threshold, "randomk": naive.ref_randomk}


def make(label):
    spec = CODECS[label]
    name, params = spec if isinstance(spec, tuple) else (label, spec)
    return compress.get(name, **params)


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def steps(n, dtype, seed, bad=None):
    """Four inputs; the third holds ``bad`` (inf or NaN) when given and there is room."""
    xs = [sample(n, dtype, seed=seed + s) for s in range(4)]
    if bad is not None and n:
        xs[2][n // 2] = bad
    return xs


def check_ef(label, xs, key="k", **encode):
    """The fused ErrorFeedback against the reference and against its own unfused path
    (``fused=False``), step by step; the payload also against the plain-NumPy decoder reference
    where there is one."""
    ef = ErrorFeedback(make(label))
    unfused = ErrorFeedback(make(label), fused=False)
    twin = make(label)
    ref = naive.ref_error_feedback(lambda c, s: twin.encode(c, key=key, step=s),
                                   lambda p: twin.decode(p), xs)
    before = np.zeros_like(xs[0])
    for step, (x, (payload, residual)) in enumerate(zip(xs, ref)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = ef.encode(x, key=key, step=step, **encode)
        same_bits(got, payload)
        same_bits(ef.residual(key), residual)
        with np.errstate(over="ignore", invalid="ignore"):
            same_bits(unfused.encode(x, key=key, step=step), payload)
        same_bits(unfused.residual(key), residual)
        assert unfused.state[key].steps == ef.state[key].steps
        with np.errstate(over="ignore", invalid="ignore"):  # scaled random-k's residual grows
            c = x + before
            if twin.name in NAIVE and np.isfinite(c).all():
                same_bits(ef.decode(got), NAIVE[twin.name](c, parts(twin, got)[0].params))
        before = residual
    if xs[0].size:
        assert ef.state[key].spare is not None  # the fused path ran
    return ef


def test_the_sparsifiers_speak_fused_feedback():
    fused = sorted(n for n, cls in compress.CODECS.items() if issubclass(cls, FusedFeedback))
    assert fused == ["dgc", "randomk", "threshold", "topk"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("label", sorted(CODECS))
def test_error_feedback_fused_equals_unfused(label, n, dtype):
    check_ef(label, steps(n, dtype, seed=n))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("label", sorted(CODECS))
def test_error_feedback_fused_keeps_the_nonfinite_rule(label, bad, dtype):
    """The overflowed step's payload carries inf or NaN, the residual stays as it was, and the
    next step goes on from it (the same bits as the reference throughout)."""
    xs = steps(4097, dtype, seed=7, bad=bad)
    ef = check_ef(label, xs[:2])
    before = ef.residual("k").copy()
    y = ef.decode(ef.encode(xs[2], key="k", step=2))
    assert not np.isfinite(y).all()
    same_bits(ef.residual("k"), before)
    check_ef(label, xs)


def signalling_nans(x, where):
    """Signalling NaNs (every exponent bit, the quiet bit clear, payload 5) at ``x[where]``,
    every other one negative."""
    info = np.finfo(x.dtype)
    word = {2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize]
    bits = x.view(word)
    at = np.arange(x.size)[where]
    bits[at] = word((((1 << info.nexp) - 1) << info.nmant) | 5)
    bits[at[1::2]] |= word(1 << (8 * x.itemsize - 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [None, "snan", -np.inf], ids=["finite", "snan", "-inf"])
@pytest.mark.parametrize("label", sorted(CODECS))
def test_the_first_step_has_the_bits_of_x_plus_zeros(label, bad, dtype):
    """A key's first step computes ``x + zeros`` into the zeros themselves and must give what
    the reference's addition gives: -0.0 turns +0.0, a signalling NaN comes out as the addition
    makes it, and a non-finite first step leaves a residual of zeros that the next step goes
    on from."""
    xs = steps(4097, dtype, seed=13)
    xs[0][::9] = -0.0
    xs[0][::1000] = -300.0  # large: sent by top-k and threshold
    if bad == "snan":
        signalling_nans(xs[0], slice(17, 4097, 601))
    elif bad is not None:
        xs[0][2048] = bad
    ef = check_ef(label, xs)
    assert ef.state["k"].steps == (3 if bad is not None else 4)


def test_the_first_step_makes_one_buffer():
    """The first fused step of a key allocates one tensor-sized buffer (its zeros, which it
    computes ``x + zeros`` into), not a residual of zeros and a spare to compute into."""
    import tracemalloc

    x = sample(1 << 20, np.float32, seed=3)
    ef = ErrorFeedback(make("topk"))
    ef.encode(x[:4097], key="warm")  # scratch buffers and kernels, outside the measurement
    tracemalloc.start()
    try:
        ef.encode(x, key="new")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert x.nbytes <= peak < 1.5 * x.nbytes
    ef.encode(x, key="new", step=1)  # the second step makes the spare
    assert ef.state["new"].spare is not None and ef.state["new"].steps == 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("label", ["topk", "topk-dense", "dgc", "threshold"])
def test_many_nonfinite_elements_reach_the_sample(label, dtype):
    """Enough inf and NaN (NaN payloads of every kind) that the sample's threshold is itself
    non-finite: the selection stays exact, the payload the same bits."""
    xs = steps(300_001, dtype, seed=9)
    xs[1][::7] = np.inf
    xs[1][3::11] = -np.nan
    xs[2][::3] = np.nan
    bits = xs[2].view({2: np.uint16, 4: np.uint32, 8: np.uint64}[xs[2].itemsize])
    bits[1::5] |= 1  # NaN payloads
    check_ef(label, xs)


@pytest.mark.parametrize("label", ["topk", "threshold", "randomk", "dgc"])
def test_float16_sum_overflow_skips_the_step(label):
    """``x + e`` can overflow float16 although both are finite: the payload carries the inf, the
    residual stays."""
    x = np.full(500, 60000.0, np.float16)
    x[::7] = -1.0
    check_ef(label, [x, x, x])


def test_random_k_decoded_value_overflow_skips_the_step():
    """Unbiased random-k decodes ``v * n / k``: finite input can decode to inf, and the residual
    ``c - inf`` is not stored (as the dense path does)."""
    x = np.full(64, 40000.0, np.float16)
    ef = ErrorFeedback(compress.get("randomk", ratio=0.5, seed=2, unbiased_scaling=True))
    twin = compress.get("randomk", ratio=0.5, seed=2, unbiased_scaling=True)
    ref = naive.ref_error_feedback(lambda c, s: twin.encode(c, key="k", step=s), twin.decode, [x, x])
    for step, (payload, residual) in enumerate(ref):
        same_bits(ef.encode(x, key="k", step=step), payload)
        same_bits(ef.residual("k"), residual)
    assert ef.state["k"].steps == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_when_the_sample_misleads(dtype):
    """The strided sample sees only the large values at its own positions, so fewer than k pass
    its threshold; or all values tie, so more than the candidate buffer pass: both fall back to the
    selection over every element, with the same result."""
    n = 300_001
    stride = n // 65536
    few = np.full(n, 0.001, dtype)
    few[:65536 * stride:stride] = 10
    check_ef("topk-dense", [few, few[::-1].copy()])
    ties = np.ones(n, dtype)
    check_ef("topk", [ties, ties])


@pytest.mark.parametrize("dtype", DTYPES)
def test_threshold_when_the_probe_misleads(dtype):
    """The strided probe sizes the candidate buffer; values that pass only between its positions
    overflow it, and a second pass collects them."""
    n = 300_001
    x = np.full(n, 0.5, dtype)
    x[1::2] = 3.0
    x[::n // 4096] = 0.25
    check_ef("threshold", [x, x])


@pytest.mark.parametrize("seed", range(6))
def test_dgc_refines_its_threshold_like_the_unfused_path(seed):
    """Few nonzeros (fewer than the target count pass the first threshold), ties at zero, and a
    small sample: the refinement ladder, collecting at a later threshold, exact selection."""
    rng = np.random.default_rng(seed)
    x = np.zeros(50_000, np.float32)
    x[rng.choice(x.size, 300 + 400 * seed, replace=False)] = rng.standard_normal(300 + 400 * seed)
    check_ef("dgc-small-sample", [x, x * 2, -x])


@pytest.mark.parametrize("dtype", DTYPES)
def test_shapes_out_and_non_contiguous_input(dtype):
    x = sample(60 * 70, dtype, seed=3, shape=(60, 70))
    xs = [x, x[::-1].copy(), 2 * x]
    check_ef("topk", xs)
    ef = ErrorFeedback(make("topk"))
    ref = ErrorFeedback(make("topk"))
    for step, y in enumerate(xs):
        out = np.empty(ef.codec.payload_nbytes(y.shape, y.dtype), np.uint8)
        got = ef.encode(np.asfortranarray(y), key="w", step=step, out=out)
        assert got is out
        same_bits(got, ref.encode(y, key="w", step=step))
        same_bits(ef.residual("w"), ref.residual("w"))
        assert ef.residual("w").shape == (60, 70)


def test_a_memory_that_adds_nothing_first_sends_the_input_as_it_is():
    """A memory whose ``addend`` is None for a new key (two-phase's server) compresses the input
    itself: -0.0 stays -0.0 in the payload (adding a zero residual would make it +0.0)."""

    class AsItIsFirst(ErrorFeedback):
        def addend(self, x, *, key=None):
            if key in self.state:
                return super().addend(x, key=key)
            self.state[key] = compress.memory.Residual(np.zeros_like(x))
            return None

    x = np.full(100, -0.0, np.float32)
    x[0] = 1.0
    codec = compress.get("topk", ratio=0.05)
    payload = AsItIsFirst(codec).encode(x, key="s")
    same_bits(payload, codec.encode(x))
    assert np.signbit(codec.decode(payload)[1:5]).all()


def test_state_dict_is_unchanged_and_resumes():
    """Only residuals and step counts are saved (the spare buffer is not state); a memory loaded
    from it continues with the same bits."""
    xs = steps(5000, np.float32, seed=2)
    ef = ErrorFeedback(make("topk"))
    for step, x in enumerate(xs[:2]):
        ef.encode(x, key="a", step=step)
    saved = ef.state_dict()
    assert sorted(saved) == ["error/a", "steps/a"] and int(saved["steps/a"]) == 2
    again = ErrorFeedback(make("topk"))
    again.load_state_dict(saved)
    for step, x in enumerate(xs[2:], start=2):
        same_bits(again.encode(x, key="a", step=step), ef.encode(x, key="a", step=step))
        same_bits(again.residual("a"), ef.residual("a"))
    assert saved["error/a"] is not ef.residual("a")


def test_mismatched_tensor_and_dtype_errors():
    ef = ErrorFeedback(make("topk"))
    ef.encode(np.ones(10, np.float32), key="k")
    with pytest.raises(ValueError, match="use a distinct key"):
        ef.encode(np.ones(11, np.float32), key="k")
    with pytest.raises(TypeError, match="valid dtypes"):
        ef.encode(np.ones(10, np.int32), key="i")
    with pytest.raises(ValueError, match="step"):
        ef.encode(np.ones(10, np.float32), key="k", step=-1)


def check_dgc(label, xs, momentum=0.9):
    memory = compress.DGCMemory(make(label), momentum=momentum)
    unfused = compress.DGCMemory(make(label), momentum=momentum, fused=False)
    twin = make(label)
    ref = naive.ref_dgc_memory(lambda v, s: twin.encode(v, key="k", step=s), twin.decode, xs,
                               momentum)
    for step, (g, (payload, u, v)) in enumerate(zip(xs, ref)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            same_bits(memory.encode(g, key="k", step=step), payload)
        same_bits(memory.state["k"].u, u)
        same_bits(memory.state["k"].v, v)
        with np.errstate(over="ignore", invalid="ignore"):
            same_bits(unfused.encode(g, key="k", step=step), payload)
        same_bits(unfused.state["k"].u, u)
        same_bits(unfused.state["k"].v, v)
    return memory


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("label", ["topk", "dgc", "threshold", "randomk"])
def test_dgc_memory_fused_equals_unfused(label, n, dtype):
    xs = steps(n, dtype, seed=n, bad=np.nan)
    if n > 4:
        xs[0][::5] = -0.0  # a sent -0.0 decodes to a zero: not "sent" for the masking
    check_dgc(label, xs)
    check_dgc(label, xs, momentum=0)


# -- streamed stores (compress/stream.py): the kernels' outputs past the caches --------

def _at_offset(n, dtype, offset):
    """An uninitialised array of ``n`` elements starting ``offset`` elements past a 64-byte
    boundary (so the streamed part starts at every possible element)."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(n * itemsize + 2 * 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64 + offset * itemsize
    return raw[start:start + n * itemsize].view(dtype)


def _collected(c, thr, cap):
    """What a scan collects from the finished ``c``: the count reaching ``thr``, the first
    ``cap`` indices and their bits."""
    idx = np.flatnonzero(~(np.abs(c) < thr))
    return idx.size, idx[:cap], c[idx[:cap]].view(_uint(c))


def _uint(a):
    return {4: np.uint32, 8: np.uint64}[a.itemsize]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 129, 1000, 4097])
def test_streamed_compensate_scan_writes_the_same_bits(n, dtype, monkeypatch):
    from compress import stream
    from compress._kernels import fused
    from compress.stream import LINE

    monkeypatch.setattr(stream, "STREAM_MIN_BYTES", 0)
    x, e = sample(n, dtype, seed=1), sample(n, dtype, seed=2)
    if n > 40:
        x[7], x[40] = np.inf, np.nan
    for offset, thr, cap in itertools.product(range(LINE // np.dtype(dtype).itemsize),
                                              (dtype(1.5), dtype(4.0)), (n, 5)):
        # |x + e| (sd 1.4): most blocks of 64 hold several past 1.5, none or one past 4
        c = _at_offset(n, dtype, offset)
        cand = np.empty(cap + 1, np.int64)
        bits = np.empty(cap + 1, _uint(c))
        head, streamed = stream.streaming(c)
        assert streamed and (head == -offset % (LINE // c.itemsize) or not n)
        with np.errstate(invalid="ignore"):
            nonfinite, count = fused.compensate_scan(x, e, c, thr, cand, bits, head,
                                                     streamed)
            want = x + e
        same_bits(c, want)
        assert nonfinite == np.count_nonzero(~np.isfinite(want))
        total, idx, wbits = _collected(want, thr, cap)
        assert count == total
        kept = min(count, cap)
        np.testing.assert_array_equal(cand[:kept], idx)
        np.testing.assert_array_equal(bits[:kept], wbits)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 65, 4097])
def test_streamed_momentum_scan_writes_the_same_bits(n, dtype):
    from compress._kernels import fused
    from compress.stream import LINE

    g, u, v = (sample(n, dtype, seed=s) for s in (3, 4, 5))
    m = dtype(0.9)
    thr = dtype(1.0)
    for offset in range(0, LINE // np.dtype(dtype).itemsize, 3):
        c, u_out = _at_offset(n, dtype, offset), np.empty(n, dtype)
        cand, bits = np.empty(n + 1, np.int64), np.empty(n + 1, _uint(c))
        head = -offset % (LINE // c.itemsize)
        nonfinite, count = fused.momentum_scan(g, u, v, u_out, c, m, thr, cand, bits, head,
                                               True)
        w = u * m + g
        same_bits(u_out, w)
        same_bits(c, v + w)
        assert nonfinite == 0
        total, idx, wbits = _collected(v + w, thr, n)
        assert count == total
        np.testing.assert_array_equal(cand[:count], idx)
        np.testing.assert_array_equal(bits[:count], wbits)


@pytest.mark.parametrize("label", ["topk", "dgc", "threshold", "randomk"])
def test_memories_streaming_their_state_equal_the_reference(label, monkeypatch):
    """Every fused memory with streamed stores from the first byte (the threshold lowered so
    that test sizes stream): the same bits as the reference, non-finite steps included."""
    from compress import stream

    monkeypatch.setattr(stream, "STREAM_MIN_BYTES", 0)
    for dtype in (np.float32, np.float64):
        check_ef(label, steps(4097, dtype, seed=7, bad=np.nan))
        check_dgc(label, steps(4097, dtype, seed=8, bad=np.inf))
