"""Codecs on device arrays: the Numba CUDA kernels give the host's payload bytes and decodes.

The same test bodies run over every device array library present: Numba device arrays (on a GPU, or
on Numba's CUDA simulator, which ``tests/conftest.py`` turns on where there is no GPU) and CuPy
(skipped without CuPy and a GPU). Sizes are small because the simulator runs every GPU thread as a
Python thread; they still cross the kernels' block, tile and byte boundaries (the simulator uses
32-thread blocks, so a compaction tile is 512 elements).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import compress
from compress._backends.cuda import is_device
from compress._kernels.cuda import select
from helpers import forged, parts, sample

# the simulator runs the RNG's wrapping uint64 arithmetic as NumPy scalars, which warn
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


@functools.cache
def _numba_problem():
    """Why Numba CUDA cannot run kernels here (None when it can): on a GPU machine without
    numba-cuda or a CUDA toolkit, the kernels cannot be compiled."""
    try:
        from numba import cuda

        from compress._backends.cuda import Device
        from compress._kernels.cuda import elementwise

        probe = cuda.to_device(np.zeros(1, np.float32))
        Device(probe).launch(elementwise.fill, 1, probe, np.float32(1))
        return None if probe.copy_to_host()[0] == 1 else "a probe kernel did not run"
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def _numba():
    problem = _numba_problem()
    if problem:
        pytest.skip(f"Numba CUDA cannot run kernels here (pip install '.[gpu]'): {problem}")
    from numba import cuda

    return cuda.to_device, lambda a: a.copy_to_host()


def _cupy():
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no CuPy, no driver or no device
        pytest.skip(f"CuPy with a GPU is not available here ({type(exc).__name__})")
    return cupy.asarray, lambda a: a.get()


@pytest.fixture(params=["numba", "cupy"])
def device(request):
    """``(to_device, to_host)`` for one device array library."""
    return {"numba": _numba, "cupy": _cupy}[request.param]()


# every codec with device kernels, with parameters that make small inputs interesting
CASES = {
    "none": {},
    "fp16": {},
    "bf16": {},
    "signsgd": {},
    "efsignsgd": {},
    "onebit": {},
    "topk": {"ratio": 0.05},
    "randomk": {"ratio": 0.1, "seed": 3, "unbiased_scaling": True},
    "threshold": {"tau": 1.0},
    "dgc": {"density": 0.05, "sample_ratio": 0.5, "seed": 4},
    "qsgd": {"levels": 5, "bucket": 100, "seed": 5},
    "terngrad": {"seed": 6},
    "eightbit": {"bucket": 128},
    "natural": {"seed": 7},
}
#: codecs whose header or scales hold a float sum: the device adds in another order, so for float64
#: input (where the order shows) those fields agree to rounding and the decodes closely
SUMMED = {"efsignsgd", "onebit", "qsgd"}


def pair(name):
    """Two identically seeded codecs: one for the host, one for the device."""
    return compress.get(name, **CASES[name]), compress.get(name, **CASES[name])


@pytest.mark.parametrize("name", sorted(CASES))
def test_device_payload_is_host_payload(device, name):
    to_device, to_host = device
    x = sample(777, np.float32, seed=1, shape=(7, 111))
    host, dev = pair(name)
    p_host = host.encode(x, key="w", step=3)
    p_dev = dev.encode(to_device(x), key="w", step=3)
    assert is_device(p_dev)
    np.testing.assert_array_equal(to_host(p_dev), p_host)
    y = dev.decode(p_dev, count=x.size)
    assert is_device(y) and y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(to_host(y), host.decode(p_host))
    if host.sparse:
        for got, want in zip(dev.sparse_parts(p_dev), host.sparse_parts(p_host)):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(to_host(got), want)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_device_nonfinite_payload_is_host_payload(device, name, bad):
    """An overflowed gradient on the device: the host's payload bytes (canonical NaN scales and
    header values), and the same non-finite decode (docs/compression.md, "Non-finite input")."""
    to_device, to_host = device
    x = sample(777, np.float32, seed=3)
    x[[5, 400]] = [bad, 0.0]
    x[401] = -0.0
    host, dev = pair(name)
    p_host = host.encode(x, key="w", step=3)
    p_dev = to_host(dev.encode(to_device(x), key="w", step=3))
    np.testing.assert_array_equal(p_dev, p_host)
    y = to_host(dev.decode(to_device(p_dev)))
    np.testing.assert_array_equal(y.view(np.uint32), host.decode(p_host).view(np.uint32))
    assert not np.isfinite(y).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("name", ["fp16", "bf16", "onebit", "topk", "qsgd", "natural", "threshold"])
def test_device_other_dtypes(device, name, dtype):
    to_device, to_host = device
    x = sample(301, dtype, seed=2)
    host, dev = pair(name)
    p_host = host.encode(x, key=1)
    p_dev = to_host(dev.encode(to_device(x), key=1))
    y_host = host.decode(p_host)
    y_dev = to_host(dev.decode(to_device(p_dev)))
    assert y_dev.dtype == y_host.dtype
    if name in SUMMED and dtype == np.float64:
        np.testing.assert_allclose(y_dev, y_host, rtol=1e-12, atol=0)
        assert p_dev.size == p_host.size
    else:
        np.testing.assert_array_equal(p_dev, p_host)
        np.testing.assert_array_equal(y_dev, y_host)


@pytest.mark.parametrize("name", sorted(CASES))
def test_device_empty_and_single(device, name):
    to_device, to_host = device
    for n in (0, 1):
        x = np.full(n, -2.5, dtype=np.float32)
        host, dev = pair(name)
        p_dev = dev.encode(to_device(x))
        np.testing.assert_array_equal(to_host(p_dev), host.encode(x))
        np.testing.assert_array_equal(to_host(dev.decode(p_dev)), host.decode(host.encode(x)))


def test_topk_ties_across_tiles(device):
    """Many equal magnitudes spread over several compaction tiles (two whole ones and a part):
    the device keeps exactly the host's elements (every larger key, then equal keys from the
    lowest index): one key; three ties after the largest keys; ties in every tile (all but
    the last zero); everything."""
    to_device, to_host = device
    n = 2 * select.TILE + 17
    x = np.random.default_rng(3).choice(np.array([0.0, 1.0, -1.0, 2.0, -2.0], np.float32), n)
    for k in (1, int((np.abs(x) == 2).sum()) + 3, n - 1, n):
        codec = compress.get("topk", ratio=k / n)
        np.testing.assert_array_equal(to_host(codec.encode(to_device(x))), codec.encode(x))


def test_threshold_many_tiles_and_nan(device):
    to_device, to_host = device
    x = sample(5 * select.TILE + 5, np.float32, seed=4)  # more tiles than (simulator) blocks
    x[[7, 600]] = [np.nan, -np.inf]
    codec = compress.get("threshold", tau=0.5)
    np.testing.assert_array_equal(to_host(codec.encode(to_device(x))), codec.encode(x))


def test_half_widening_all_words(device):
    """Every binary16 word, widened on the device, equals NumPy's cast (NaN payloads included)."""
    to_device, to_host = device
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    codec = compress.get("fp16")
    payload = codec.encode(np.zeros(words.size, np.float32))
    hdr, body = parts(codec, payload)
    body["half"][:] = words
    got = to_host(codec.decode(to_device(payload)))
    np.testing.assert_array_equal(got.view(np.uint32), words.view(np.float16).astype(np.float32).view(np.uint32))


def test_half_rounding_edges(device):
    to_device, to_host = device
    f32 = np.array([65504, 65519.996, 65520, 2**-24, 2**-25, 1.5 * 2**-25, 6.1e-5, 1 + 2**-11,
                    1 + 3 * 2**-11, np.inf, -np.inf, np.nan, -0.0, 1e-45, 3e38], dtype=np.float32)
    codec = compress.get("fp16")
    for x in (f32, f32.astype(np.float64), np.array([1 + 2**-11 + 2**-40, 2**-25 + 2**-60]), ):
        np.testing.assert_array_equal(to_host(codec.encode(to_device(x))), codec.encode(x))


def test_encode_into_device_out(device):
    to_device, to_host = device
    x = sample(100, np.float32)
    codec = compress.get("qsgd", levels=3, bucket=32, seed=0)
    out = to_device(np.zeros(codec.payload_nbytes(x.shape), np.uint8))
    assert codec.encode(to_device(x), out=out) is out
    np.testing.assert_array_equal(to_host(out), compress.get("qsgd", levels=3, bucket=32, seed=0).encode(x))
    with pytest.raises(ValueError, match="device array of exactly"):
        codec.encode(to_device(x), out=to_device(np.zeros(5, np.uint8)))
    with pytest.raises(ValueError, match="device array of exactly"):
        codec.encode(to_device(x), out=np.zeros(codec.payload_nbytes(x.shape), np.uint8))


def test_device_input_checks(device):
    to_device, _ = device
    with pytest.raises(TypeError, match="does not support dtype"):
        compress.get("topk").encode(to_device(np.arange(4)))
    with pytest.raises(TypeError, match="1-D uint8"):
        compress.get("topk").decode(to_device(np.zeros(4, np.float32)))


def test_powersgd_needs_cupy_on_device():
    to_device, _ = _numba()
    with pytest.raises(TypeError, match="use CuPy arrays on the device"):
        compress.get("powersgd").encode(to_device(np.ones((4, 4), np.float32)))


def _hostile(name, x, edit):
    codec = compress.get(name, **CASES[name])
    payload = codec.encode(x)
    edit(*parts(codec, payload))
    return codec, payload


HOSTILE = {
    "topk out of order": ("topk", lambda h, b: b["indices"].__setitem__(slice(0, 2), [5, 5]), "out of range or out of order"),
    "topk out of range": ("topk", lambda h, b: b["indices"].__setitem__(-1, 1000), "out of range or out of order"),
    "dgc out of range": ("dgc", lambda h, b: b["indices"].__setitem__(0, 2**32 - 1), "out of range or out of order"),
    "threshold index": ("threshold", lambda h, b: b["words"].__setitem__(-1, 2 * 1000), "out-of-range or out-of-order"),
    "qsgd inf scale": ("qsgd", lambda h, b: b["scales"].__setitem__(1, np.inf), "not infinite"),
    "qsgd negative scale": ("qsgd", lambda h, b: b["scales"].__setitem__(0, -1.0), ">= 0"),
    "qsgd code too big": ("qsgd", lambda h, b: b["codes"].__setitem__(0, 0xFF), "exceed the largest level code"),
    "terngrad padding": ("terngrad", lambda h, b: b["codes"].__setitem__(-1, 0xFF), "padding"),
    "signsgd padding": ("signsgd", lambda h, b: b["bits"].__setitem__(-1, 0xFF), "padding"),
    "natural padding": ("natural", lambda h, b: b["signs"].__setitem__(-1, 0xFF), "padding"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_device_payloads_rejected(device, case):
    """Device decoders validate before they write, with the host's messages."""
    to_device, _ = device
    name, edit, message = HOSTILE[case]
    codec, payload = _hostile(name, sample(999, np.float32, seed=5), edit)
    with pytest.raises(ValueError, match=message):
        codec.decode(payload)
    with pytest.raises(ValueError, match=message):
        codec.decode(to_device(payload))


@pytest.mark.parametrize("name", sorted(CASES))
def test_device_forged_huge_count(device, name):
    """A device payload whose header claims 2**31 - 1 elements (dense formats: 2**40) is
    rejected by the same checks as on the host (compress.DECODE_MAX_ELEMENTS), before any
    device memory of that size is allocated."""
    to_device, _ = device
    codec = compress.get(name, **CASES[name])
    dense = not codec.sparse
    codec, payload, _ = forged(codec, codec.encode(sample(99, np.float32)),
                               1 << 40 if dense else (1 << 31) - 1)
    with pytest.raises(ValueError, match=None if dense else "max_elements"):
        codec.decode(to_device(payload))


@pytest.mark.parametrize("name", ["topk", "qsgd", "onebit"])
def test_device_framing_errors(device, name):
    to_device, _ = device
    codec = compress.get(name, **CASES[name])
    payload = codec.encode(sample(50, np.float32))
    with pytest.raises(ValueError, match="expected 49"):
        codec.decode(to_device(payload), count=49)
    for bad in (payload[:-1], np.concatenate([payload, np.zeros(1, np.uint8)]), payload[:10]):
        with pytest.raises(ValueError):
            codec.decode(to_device(bad))
    with pytest.raises(ValueError, match="codec id"):
        compress.get("signsgd").decode(to_device(payload))


@pytest.mark.parametrize("name", ["topk", "qsgd", "threshold", "eightbit"])
def test_random_bit_flips_same_verdict(device, name):
    """A corrupted payload is rejected on the device exactly when the host rejects it, and
    otherwise decodes to the same values."""
    to_device, to_host = device
    codec = compress.get(name, **CASES[name])
    payload = codec.encode(sample(200, np.float32, seed=6))
    rng = np.random.default_rng(7)
    for _ in range(6):
        bad = payload.copy()
        pos = rng.integers(0, bad.size * 8, 2)
        bad[pos // 8] ^= (1 << (pos % 8)).astype(np.uint8)
        try:
            want = codec.decode(bad)
        except ValueError:
            with pytest.raises(ValueError):
                codec.decode(to_device(bad))
        else:
            np.testing.assert_array_equal(to_host(codec.decode(to_device(bad))), want)


def test_kernels_compile_for_a_real_gpu(tmp_path):
    """Every kernel compiles to sm_90 PTX (what the simulator cannot check); needs numba-cuda and
    NVVM, not a GPU."""
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("numba_cuda") is None:
        pytest.skip("numba-cuda is not installed (pip install 'numba-cuda[cu12]')")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    script = Path(__file__).with_name("ptx_check.py")
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_memories_need_arithmetic_arrays_on_device():
    """Error feedback does array arithmetic: CuPy arrays on the device, not Numba's."""
    to_device, _ = _numba()
    ef = compress.ErrorFeedback(compress.get("topk"))
    with pytest.raises(TypeError, match="use CuPy arrays on the device"):
        ef.encode(to_device(np.ones(10, np.float32)))


def test_error_feedback_on_cupy_matches_host(device):
    """ErrorFeedback around a device codec keeps a device residual equal to the host one."""
    to_device, to_host = device
    if to_device.__module__.startswith("numba"):
        pytest.skip("Numba device arrays have no arithmetic (see the test above)")
    host = compress.ErrorFeedback(compress.get("topk", ratio=0.1))
    dev = compress.ErrorFeedback(compress.get("topk", ratio=0.1))
    for step in range(3):
        x = sample(500, np.float32, seed=step)
        np.testing.assert_array_equal(to_host(dev.encode(to_device(x), key="w")), host.encode(x, key="w"))
        np.testing.assert_array_equal(to_host(dev.residual("w")), host.residual("w"))
