"""Framework arrays and bfloat16 on one process: what the entry points take and give back.

The multi-rank behaviour (every collective, every dtype, DistributedOptimizer, the DDP hook) is
tested in tests/mpi/mpi_torch.py; here: the array layer's decisions, the bf16 word arithmetic
against ml_dtypes, codecs on tensors, and that the core imports neither torch nor ml_dtypes.
"""

import array
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import compress
from collectives.ops import get_op
from compress.arrays import as_array, is_bfloat16, like, same_memory

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
SELF = MPI.COMM_SELF


def test_core_imports_neither_torch_nor_ml_dtypes():
    code = ("import sys, collectives, compress; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'ml_dtypes', 'jax')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_buffers_in_numpy_out():
    """Buffer-protocol objects are read zero-copy; the result of a new array is NumPy."""
    a = array.array("d", [1.0, 2.0, 3.0])
    y = collectives.allreduce(a, comm=SELF)
    assert isinstance(y, np.ndarray) and y.tolist() == [1.0, 2.0, 3.0]
    b = bytearray(b"\x01\x02")
    assert collectives.bcast(b, comm=SELF) is b  # in place: the caller's object
    with pytest.raises(TypeError, match="must be a numpy.ndarray"):
        collectives.allreduce([1.0, 2.0], comm=SELF)


def test_same_memory_is_in_place_partial_overlap_is_not():
    x = np.arange(6.0)
    assert collectives.allreduce(x, out=x.view(), comm=SELF) is not None
    assert same_memory(x, x.view()) and not same_memory(x, x[1:])
    assert same_memory(x, np.frombuffer(x.data, x.dtype))  # another object over the same bytes
    assert not same_memory(x, x.copy()) and not same_memory(x, x[::-1])
    assert not same_memory(x[::2], x[1::2])  # interleaved: overlapping extents, other elements
    e = np.empty(0)
    assert same_memory(e, e.view())
    with pytest.raises(ValueError, match="overlaps"):
        collectives.allreduce(x[:5], out=x[1:], comm=SELF)


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
def test_bf16_word_ops_round_like_ml_dtypes(op):
    """Each word-form op widens to float32, applies the op and rounds to nearest even: bitwise
    what ml_dtypes' own bf16 ufuncs give (which round every operation)."""
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(4096) * 10 ** rng.uniform(-3, 3, 4096)).astype(BF16)
    b = (rng.standard_normal(4096) * 10 ** rng.uniform(-3, 3, 4096)).astype(BF16)
    a[:4] = [np.inf, -np.inf, 0.0, -0.0]
    the_op = get_op(op, BF16)
    assert the_op.words
    out = np.empty(a.size, np.uint16)
    the_op.combine(a.view(np.uint16), b.view(np.uint16), out)
    expected = {"sum": np.add, "avg": np.add, "prod": np.multiply,
                "min": np.minimum, "max": np.maximum}[op](a, b)
    assert np.array_equal(out, expected.view(np.uint16))
    if op == "avg":
        the_op.divide(out, 3)
        assert np.array_equal(out, (expected.astype(np.float32) / np.float32(3)).astype(BF16)
                              .view(np.uint16))


def test_bf16_numpy_through_a_collective():
    x = np.array([1.5, -2.25, 3.0], dtype=BF16)
    y = collectives.allreduce(x, op="avg", comm=SELF)
    assert y.dtype == BF16 and np.array_equal(y.view(np.uint16), x.view(np.uint16))
    assert is_bfloat16(y.dtype) and not is_bfloat16(np.dtype(np.uint16))


def test_bf16_native_is_a_user_op_on_words():
    from collectives._runtime.mpitypes import native_op, native_type
    op = get_op("sum", BF16)
    assert native_type(np.dtype(np.uint16)).Get_size() == 2  # words of 16 bits
    assert native_op(op, np.dtype(np.uint16)) not in (MPI.SUM, MPI.MAX)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int8, torch.int32, torch.int64, torch.uint8], ids=str)
def test_tensor_in_tensor_out(dtype):
    t = (torch.arange(12) % 7).to(dtype).reshape(3, 4)
    for y in (collectives.allreduce(t, comm=SELF), collectives.reduce(t, comm=SELF),
              collectives.allgather(t, comm=SELF), collectives.reduce_scatter(t, comm=SELF)):
        assert isinstance(y, torch.Tensor) and y.dtype == dtype
        assert torch.equal(y.reshape(-1), t.reshape(-1))
    out = torch.empty_like(t)
    assert collectives.allreduce(t, out=out, comm=SELF) is out and torch.equal(out, t)
    assert collectives.allreduce(t, out=t, comm=SELF) is t
    v = as_array(t)
    assert v.__array_interface__["data"][0] == t.data_ptr()  # zero-copy
    back = like(t, v)
    assert isinstance(back, torch.Tensor) and back.data_ptr() == t.data_ptr()


def test_transposed_tensor_is_fortran_order_and_kept():
    t = torch.arange(6.0).reshape(2, 3).T
    y = collectives.allreduce(t, comm=SELF)
    assert torch.equal(y, t) and y.stride() == t.stride()


def test_tensor_errors():
    with pytest.raises(ValueError, match=r"contiguous.*x\.contiguous\(\)"):
        collectives.allreduce(torch.zeros(4, 6)[:, ::2], comm=SELF)
    with pytest.raises(TypeError, match="requires grad"):
        collectives.allreduce(torch.zeros(3, requires_grad=True), comm=SELF)
    with pytest.raises(TypeError, match="unsupported dtype"):
        collectives.allreduce(torch.zeros(3, dtype=torch.complex64), comm=SELF)
    with pytest.raises(ValueError, match="dtype"):
        collectives.allreduce(torch.zeros(3), out=torch.zeros(3, dtype=torch.float64), comm=SELF)


def test_codecs_take_and_give_tensors():
    t = torch.randn(100)
    codec = compress.get("topk", ratio=0.1)
    payload = codec.encode(t)
    assert isinstance(payload, torch.Tensor) and payload.dtype == torch.uint8
    y = codec.decode(payload)
    assert isinstance(y, torch.Tensor) and y.shape == t.shape
    np.testing.assert_array_equal(y.numpy(), codec.decode(payload.numpy()))
    ef = compress.ErrorFeedback(compress.get("fp16"))
    assert isinstance(ef.encode(t, key="w"), torch.Tensor)
    z = collectives.compressed_allreduce(t, compress.get("fp16"), comm=SELF)
    assert isinstance(z, torch.Tensor)
