"""Error feedback with a narrower residual (``ErrorFeedback(codec, residual_dtype=...)``).

Against a plain-NumPy reference of every step (``c = x + widen(e)`` in float32, ``e =
round(c - decode(encode(c)))`` in the residual dtype: NumPy's cast for float16, ml_dtypes' for
bfloat16): the same payloads and the same stored words, on the fused path and the generic one;
the stored residual's bytes; the bound on what the rounding loses over many steps; state_dict
round trips that continue bit for bit; float16's saturation; bad input.
"""

import ml_dtypes
import numpy as np
import pytest

import compress
from collectives import CompressionState
from compress.memory import ErrorFeedback
from compress.residual import RESIDUAL_DTYPES

NARROW = ("float16", "bfloat16")
#: a sparse codec that speaks the fused protocol, one that does not take it (values all sent:
#: the generic path's decode and subtraction), and one that sends scaled signs
CODECS = ("topk:ratio=0.05", "eightbit:bucket=64", "efsignsgd")


def _round(values: np.ndarray, name: str) -> np.ndarray:
    """The reference narrowing: float32 values to the stored array (NumPy's correctly rounded
    casts; float16 saturated at its largest finite value)."""
    if name == "bfloat16":
        return values.astype(ml_dtypes.bfloat16).view(np.uint16)
    with np.errstate(over="ignore"):
        half = values.astype(np.float16)
    return np.where(np.isinf(half), np.copysign(np.float16(65504), half), half)


def _widen(stored: np.ndarray, name: str) -> np.ndarray:
    if name == "bfloat16":
        return stored.view(ml_dtypes.bfloat16).astype(np.float32)
    return stored.astype(np.float32)


def _inputs(steps=12, n=517, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * 10.0 ** rng.integers(-6, 2, n)).astype(np.float32)
            for _ in range(steps)]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("spec", CODECS)
@pytest.mark.parametrize("name", NARROW)
def test_every_step_matches_the_reference(name, spec, fused):
    codec = compress.from_spec(spec)
    ref_codec = compress.from_spec(spec)
    ef = ErrorFeedback(codec, fused=fused, residual_dtype=name)
    e = None
    for t, x in enumerate(_inputs()):
        payload = ef.encode(x, key="w", step=t)
        c = x + (np.zeros_like(x) if e is None else _widen(e, name))
        want = ref_codec.encode(c, key="w", step=t)
        assert payload.tobytes() == want.tobytes(), t
        e = _round(c - ref_codec.decode(want, count=c.size), name)
        stored = ef.state["w"].error
        assert stored.dtype == RESIDUAL_DTYPES[name].storage
        assert stored.nbytes == 2 * x.size  # two bytes per element, not four
        assert stored.tobytes() == e.tobytes(), t


@pytest.mark.parametrize("name", NARROW)
def test_what_was_not_sent_is_carried_to_the_residual_dtype_rounding(name):
    """``|sum x - sum sent - e_T| <= sum_t (2**-24 |c_t| + u |r_t|)`` element by element: float32's
    rounding of ``c_t = x_t + e_{t-1}`` and the residual dtype's of ``r_t = c_t - sent_t``
    (``u`` = 2**-11 for float16, 2**-8 for bfloat16; float16 also loses at most 2**-25 per step
    in its subnormal range); and the bound is not vacuous: the loss is above float32's."""
    u = RESIDUAL_DTYPES[name].unit_roundoff
    losses = {}
    for dtype in (None, name):
        ef = ErrorFeedback(compress.get("topk", ratio=0.02), residual_dtype=dtype)
        total = np.zeros(517)
        sent = np.zeros(517)
        bound = np.zeros(517)
        e = np.zeros(517, np.float32)
        for t, x in enumerate(_inputs(steps=40)):
            payload = ef.encode(x, key=0, step=t)
            d = ef.decode(payload, count=x.size).astype(np.float64)
            c = x.astype(np.float64) + e
            total += x
            sent += d
            bound += 2.0 ** -24 * np.abs(c) + u * np.abs(c - d) + (2.0 ** -25 if name ==
                                                                 "float16" else 0.0)
            e = ef.residual(0).astype(np.float32)
        loss = np.abs(total - sent - e)
        losses[dtype] = loss.max()
        assert (loss <= bound * (1 + 1e-6)).all(), (loss - bound).max()
    assert losses[name] > 10 * losses[None]


@pytest.mark.parametrize("name", NARROW)
def test_state_dict_resumes_bit_for_bit(name):
    xs = _inputs(steps=10)
    whole = ErrorFeedback(compress.get("topk", ratio=0.05), residual_dtype=name)
    first = ErrorFeedback(compress.get("topk", ratio=0.05), residual_dtype=name)
    for t, x in enumerate(xs[:5]):
        whole.encode(x, key="a", step=t)
        first.encode(x, key="a", step=t)
    saved = first.state_dict()
    assert saved["error/a"].dtype == RESIDUAL_DTYPES[name].storage
    again = ErrorFeedback(compress.get("topk", ratio=0.05), residual_dtype=name)
    again.load_state_dict(saved)
    for t, x in enumerate(xs[5:], start=5):
        assert whole.encode(x, key="a", step=t).tobytes() == \
            again.encode(x, key="a", step=t).tobytes()
    assert whole.state["a"].error.tobytes() == again.state["a"].error.tobytes()


def test_memory_held_per_key_is_the_narrow_residual_alone():
    """Two keys of 1,000 elements: float32 error feedback holds a residual and a spare per key
    (16 kB); bfloat16 holds 2 bytes per element per key and two shared scratch buffers of the
    largest key (4 kB + 8 kB), and a CompressionState reports the same."""
    held = {}
    for name in (None, "bfloat16"):
        state = CompressionState.from_spec("topk:ratio=0.01", error_feedback=True,
                                           residual_dtype=name)
        for t in range(3):
            for key in ("a", "b"):
                state.memory.encode(np.ones(1000, np.float32) * (t + 1), key=key, step=t)
        held[name] = state.held_nbytes()
        assert held[name] == state.memory.held_nbytes()
    assert held == {None: 16000, "bfloat16": 4000 + 8000}


def test_float16_saturates_instead_of_overflowing():
    ef = ErrorFeedback(compress.get("topk", ratio=0.01), residual_dtype="float16")
    x = np.full(200, 1e5, np.float32)
    x[0] = 2e5  # sent, with one other (k = 2)
    ef.encode(x, key=0, step=0)
    e = ef.state[0].error
    assert e[0] == 0 and np.count_nonzero(e == 65504) == 198 and np.isfinite(e).all()


def test_float32_residual_of_float32_tensors_is_the_default():
    xs = _inputs(steps=5)
    a = ErrorFeedback(compress.get("topk", ratio=0.05))
    b = ErrorFeedback(compress.get("topk", ratio=0.05), residual_dtype="float32")
    for t, x in enumerate(xs):
        assert a.encode(x, key=0, step=t).tobytes() == b.encode(x, key=0, step=t).tobytes()
    assert a.state[0].error.tobytes() == b.state[0].error.tobytes()


def test_float64_tensors_round_through_float32():
    ef = ErrorFeedback(compress.get("topk", ratio=0.01), residual_dtype="bfloat16")
    x = np.linspace(-1, 1, 300)
    ef.encode(x, key=0)
    want = _round(x.astype(np.float32), "bfloat16")
    want[np.argmax(np.abs(x))] = 0  # the one element sent... and its twin
    e = ef.state[0].error
    sent = np.flatnonzero(e != want)
    assert e.dtype == np.uint16 and len(sent) <= 2 and (e[sent] == 0).all()
    assert ef.residual(0).dtype == np.float32


def test_bad_residual_dtypes():
    with pytest.raises(ValueError, match="residual_dtype must be one of float32, float16"):
        ErrorFeedback(compress.get("topk"), residual_dtype="int8")
    with pytest.raises(ValueError, match="has no error feedback"):
        CompressionState.from_spec("topk", residual_dtype="float16")
    ef = ErrorFeedback(compress.get("topk"), residual_dtype="bfloat16")
    with pytest.raises(ValueError, match="uint16 words"):
        ef.load_state_dict({"error/a": np.zeros(4, np.float32)})
