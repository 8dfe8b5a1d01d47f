"""The shared-memory fold kernel against NumPy, bit for bit, in one process (no MPI needed).

``fold`` must combine operands left to right (rank order) exactly as chained NumPy ufuncs do:
wrapping integers, float16 rounded after every operation, ``np.minimum``/``np.maximum``'s choice
between signed zeros and their NaN propagation; and it must allow a destination that is one of
the operands (in place). Each test runs the kernels and their interpreted twins
(``kernels/interpreted.py``: what a rank runs while the kernel compiles), which must agree.
"""

import numpy as np
import pytest

import collectives
from collectives._runtime.shmem import layout

UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _kernels():
    """The kernel modules (imported here: Numba comes with them)."""
    from collectives._runtime.shmem.kernels import arithmetic, copies, memory

    return arithmetic, copies, memory


def _operands(dtype, op, p, n, seed=0):
    rng = np.random.default_rng(seed)
    if dtype.kind == "f":
        xs = [rng.standard_normal(n) * (0.9 if op == "prod" else 4) for _ in range(p)]
        for x in xs:  # signed zeros and NaNs where min/max must pick consistently
            x[::5], x[1::7], x[2::11] = 0.0, -0.0, np.nan
    else:
        info = np.iinfo(dtype)
        xs = [rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True) for _ in range(p)]
    return [np.ascontiguousarray(x, dtype=dtype) for x in xs]


DRIVERS = ["kernel", "interpreted"]


@pytest.fixture(params=DRIVERS)
def driver(request):
    return request.param


def _kernel(module, name, driver):
    """Kernel ``name`` of ``module``, compiled or interpreted."""
    from collectives._runtime.shmem.kernels import interpreted

    kernel = getattr(module, name)
    return kernel if driver == "kernel" else interpreted.interpret(kernel)


def _fold(op, xs, dsts, driver="kernel"):
    arithmetic, _, memory = _kernels()
    token = memory.FLOAT16 if xs[0].dtype == np.float16 else xs[0]
    view = (lambda a: a.view(np.uint16)) if xs[0].dtype == np.float16 else (lambda a: a)
    srcs = np.array([view(x).ctypes.data for x in xs], np.int64)
    outs = np.array([view(d).ctypes.data for d in dsts], np.int64)
    scratch = np.empty(layout.FOLD_BLOCK * 8, np.uint8)
    fold = arithmetic.fold
    if driver != "kernel":
        from collectives._runtime.shmem.kernels import interpreted

        fold = interpreted.fold
    fold(layout.OPCODES[op], token, srcs, len(xs), outs, len(dsts), xs[0].size,
         scratch.ctypes.data)


@pytest.mark.parametrize("op", list(UFUNCS))
@pytest.mark.parametrize("dtype", collectives.SUPPORTED_DTYPES, ids=str)
def test_fold_matches_chained_numpy_bitwise(dtype, op, driver):
    n = 2 * layout.FOLD_BLOCK + 37  # several blocks and a ragged end
    for p in (1, 2, 3, 5):
        xs = _operands(dtype, op, p, n, seed=p)
        expected = xs[0].copy()
        with np.errstate(all="ignore"):
            for x in xs[1:]:
                expected = UFUNCS[op](expected, x)
        outs = [np.full(n, 7, dtype) for _ in range(3)]
        _fold(op, xs, outs, driver)
        for out in outs:
            assert np.array_equal(out.view(np.uint8), expected.view(np.uint8)), (p, dtype, op)


def test_fold_in_place_into_a_later_operand(driver):
    """The destination may be any of the operands, e.g. the last one (a rank's own input)."""
    xs = _operands(np.dtype(np.float32), "sum", 4, 5000)
    expected = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    other = np.empty_like(xs[0])
    _fold("sum", xs, [xs[3], other], driver)
    for out in (xs[3], other):
        assert np.array_equal(out.view(np.uint8), expected.view(np.uint8))


def test_signed_zero_and_nan_choices(driver):
    """The rank-order convention, spelled out: ties keep the later operand like np.minimum."""
    a = np.array([0.0, -0.0, np.nan, 1.0], np.float64)
    b = np.array([-0.0, 0.0, 1.0, np.nan], np.float64)
    for op in ("min", "max"):
        out = np.empty_like(a)
        _fold(op, [a, b], [out], driver)
        ref = UFUNCS[op](a, b)
        assert np.array_equal(np.signbit(out), np.signbit(ref)) and \
            np.array_equal(np.isnan(out), np.isnan(ref)), op


def test_float16_signed_zero_and_nan_choices_are_numpys(driver):
    """float16 has NumPy's float16 loops' own choices, not float32's: min/max keep the first
    operand when it is <= (>=) the second (``min(-0.0, 0.0)`` is -0.0), and a NaN second
    operand of a sum or product is the result, whichever NaN the first is: the kernel and its
    interpreted twin give NumPy's bits (so ranks on either driver agree)."""
    a = np.array([-0.0, 0.0, np.nan, 1.0, np.nan, -0.0] * 700, np.float16)
    b = np.array([0.0, -0.0, 1.0, np.nan, -np.nan, -0.0] * 700, np.float16)
    for op in UFUNCS:
        out = np.empty_like(a)
        _fold(op, [a, b], [out], driver)
        ref = UFUNCS[op](a, b)
        assert np.array_equal(out.view(np.uint16), ref.view(np.uint16)), (op, out[:6], ref[:6])


def _cma_table(pid):
    """A one-rank table with what ``kernels.copies.cma_read`` needs (process id ``pid``)."""
    from collectives._runtime.shmem.team import _cma_functions

    functions = _cma_functions()
    if functions is None:
        pytest.skip("no process_vm_readv here")
    tab = np.zeros(layout.T_BASE + 3, np.int64)
    bounce = np.zeros(64, np.int64)
    tab[layout.T_P], tab[layout.T_BOUNCE] = 1, bounce.ctypes.data + 64
    tab[layout.T_READV], tab[layout.T_ERRNO] = functions
    tab[layout.T_BASE + 2] = pid
    return tab, bounce


def test_cross_memory_read_copies_and_reports_failure(driver):
    """``cma_read`` copies from a process's memory (here this one's), and reports the errno
    when the kernel refuses: a process that is gone (ESRCH), an address not mapped (EFAULT)."""
    import errno
    import os

    cma_read = _kernel(_kernels()[1], "cma_read", driver)  # (arithmetic, copies, memory)
    src, dst = np.arange(1000, dtype=np.float64), np.zeros(1000)
    tab, _ = _cma_table(os.getpid())
    if not cma_read(tab, 0, dst.ctypes.data, src.ctypes.data, src.nbytes):
        pytest.skip(f"process_vm_readv is not permitted here ({os.strerror(tab[layout.T_ERR])})")
    assert np.array_equal(dst, src)
    assert not cma_read(tab, 0, dst.ctypes.data, 8, 64)  # page 0 is never mapped
    assert (tab[layout.T_BAD], tab[layout.T_ERR]) == (0, errno.EFAULT)
    gone = 1 << 22  # above any pid_max: no such process
    tab, _ = _cma_table(gone)
    assert not cma_read(tab, 0, dst.ctypes.data, src.ctypes.data, src.nbytes)
    assert tab[layout.T_ERR] == errno.ESRCH


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8, 9])
@pytest.mark.parametrize("slot_bytes", [64, 4160, 65536])
def test_every_ranks_segment_starts_on_a_cache_line(p, slot_bytes):
    """MPI lays the ranks' segments end to end: a segment size that is not a whole number of
    cache lines would start every other rank's control block (whose counters each have a line
    of their own) in the middle of a line. At p = 2, 4 and 8 it did, by 32 bytes."""
    size = layout.window_bytes(slot_bytes, p)
    assert size % 64 == 0
    assert size >= layout.offsets_at(slot_bytes) + 2 * 2 * (p + 1) * 8  # room for the tables
    assert layout.READY * 8 % 64 == 0 and layout.DONE * 8 % 64 == 0  # lines of their own
