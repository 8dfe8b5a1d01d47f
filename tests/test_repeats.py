"""The one cache of remembered calls (``_runtime/repeats.py``), its "nothing changed" check
alone, in one process: entries made as ``api.allreduce`` makes them, found or not after each
change that can happen in place. A pair of NumPy arrays, and a pair of tensors, is checked
field by field in line; these tests hold that check to the fingerprint function it stands for.
"""

import types
import warnings

import numpy as np
import pytest

from collectives._runtime.arrays import check_input, flat
from collectives._runtime.repeats import KINDS, Repeat, Repeats, kind_of


def _remember(cache: Repeats, x, out) -> Repeat:
    """An entry of ``allreduce(x, out=out)`` (views as the checked call makes them) in
    ``cache``; its communicator state is live."""
    src = flat(check_input(x))
    dst = src if out is x else flat(check_input(out))
    call = types.SimpleNamespace(src=x if src is x else src, dst=out if dst is out else dst,
                                 opts=None)
    entry = Repeat("allreduce", call, x, out, "sum", "auto", None, None,
                   types.SimpleNamespace(live=True), kind_of(x), kind_of(out))
    cache.remember(entry)
    return entry


def _strides(a: np.ndarray, strides: tuple) -> None:
    with warnings.catch_warnings():  # deprecated in NumPy 2.4, still possible
        warnings.simplefilter("ignore", DeprecationWarning)
        a.strides = strides


#: what can change in place on the arrays of a remembered call, and whether the call may still
#: repeat afterwards, out of place and in place (x is out): the arrays a call writes must stay
#: writeable; the array it only reads may turn read-only
CHANGES = {
    "nothing": (lambda x, o: None, True, True),
    "x reshaped": (lambda x, o: setattr(x, "shape", (3, 4)), False, False),
    "out reshaped": (lambda x, o: setattr(o, "shape", (4, 3)), False, False),
    "x strides": (lambda x, o: _strides(x, (0,)), False, False),
    "out strides": (lambda x, o: _strides(o, (0,)), False, False),
    "x dtype": (lambda x, o: setattr(x, "dtype", np.int64), False, False),
    "out dtype": (lambda x, o: setattr(o, "dtype", np.int64), False, False),
    "x read-only": (lambda x, o: setattr(x.flags, "writeable", False), True, False),
    "out read-only": (lambda x, o: setattr(o.flags, "writeable", False), False, False),
}


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_numpy_changes_in_place_are_noticed_as_the_fingerprint_notices_them(change, in_place):
    cache = Repeats()
    x = np.arange(12, dtype=np.float64)
    out = x if in_place else np.zeros(12)
    entry = _remember(cache, x, out)
    assert entry.numpy and cache.find("allreduce", x, out, "sum", "auto", None, None) is entry
    mutate, out_of_place_repeats, in_place_repeats = CHANGES[change]
    mutate(x, out)
    repeats = in_place_repeats if in_place else out_of_place_repeats
    found = cache.find("allreduce", x, out, "sum", "auto", None, None)
    assert (found is entry) is repeats, change
    # the fingerprint functions of the NumPy kind decide the same
    by_prints = entry.xprint(x) == entry.xseen and (out is x or entry.oprint(out) == entry.oseen)
    assert by_prints is repeats, change


def test_other_arguments_and_gone_arrays_are_never_repeated():
    cache = Repeats()
    x, out = np.ones(5), np.zeros(5)
    entry = _remember(cache, x, out)
    find = cache.find
    assert find("allreduce", x, out, "sum", "auto", None, None) is entry
    assert find("iallreduce", x, out, "sum", "auto", None, None) is None
    assert find("allreduce", out, x, "sum", "auto", None, None) is None
    assert find("allreduce", x, out, "max", "auto", None, None) is None
    assert find("allreduce", x, out, "sum", "ring", None, None) is None
    assert find("allreduce", x, out, "sum", "auto", object(), None) is None
    assert find("allreduce", x, out, "sum", "auto", None, object()) is None  # other options=
    assert find("allreduce", x, None, "sum", "auto", None, None) is None
    entry.where.live = False  # the communicator freed or reset
    assert find("allreduce", x, out, "sum", "auto", None, None) is None
    entry.where.live = True
    del out  # its weak reference now gives None: out=None must not match it
    assert find("allreduce", x, None, "sum", "auto", None, None) is None


def test_an_empty_cache_finds_nothing():
    cache = Repeats()
    assert cache.find("allreduce", None, None, "sum", "auto", None, None) is None
    x = np.ones(3)
    assert cache.find("allreduce", x, x, "sum", "auto", None, None) is None


def test_tensors_are_checked_by_their_fingerprint():
    torch = pytest.importorskip("torch")
    assert ("torch", "Tensor") in KINDS
    cache = Repeats()
    x, out = torch.ones(6), torch.zeros(6)
    entry = _remember(cache, x, out)
    assert not entry.numpy and entry.pair is not None  # views kept: made once
    assert cache.find("allreduce", x, out, "sum", "auto", None, None) is entry
    out.requires_grad_()
    assert cache.find("allreduce", x, out, "sum", "auto", None, None) is None
    out.requires_grad_(False)
    out.set_(torch.zeros(6))  # new memory: its kept view would be stale
    assert cache.find("allreduce", x, out, "sum", "auto", None, None) is None


#: what can change in place on a remembered call's tensors (x is 12 float64 elements, out too
#: or x itself): every change turns the call into a first call again
TENSOR_CHANGES = {
    "nothing": lambda x, o: None,
    "x reshaped": lambda x, o: x.resize_(3, 4),
    "out reshaped": lambda x, o: o.resize_(4, 3),
    "x strides": lambda x, o: x.as_strided_((12,), (0,)),
    "out strides": lambda x, o: o.as_strided_((6,), (2,)),
    "out transposed": lambda x, o: o.resize_(4, 3).t_(),
    "x new memory": lambda x, o: x.set_(x.new_zeros(12)),
    "out new memory": lambda x, o: o.set_(o.new_zeros(13).untyped_storage(), 1, (12,), (1,)),
    "x dtype": lambda x, o: setattr(x, "data", x.view(__import__("torch").int64)),
    "out dtype": lambda x, o: setattr(o, "data", o.view(__import__("torch").int64)),
    "x requires grad": lambda x, o: x.requires_grad_(),
    "out requires grad": lambda x, o: o.requires_grad_(),
}


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("change", list(TENSOR_CHANGES))
def test_tensor_changes_in_place_are_noticed_as_the_fingerprint_notices_them(change, in_place):
    torch = pytest.importorskip("torch")
    cache = Repeats()
    x = torch.arange(12, dtype=torch.float64)
    out = x if in_place else torch.zeros(12, dtype=torch.float64)
    entry = _remember(cache, x, out)
    assert entry.torch and cache.find("allreduce", x, out, "sum", "auto", None, None) is entry
    with torch.no_grad():
        TENSOR_CHANGES[change](x, out)
    repeats = change == "nothing"
    found = cache.find("allreduce", x, out, "sum", "auto", None, None)
    assert (found is entry) is repeats, change
    # the fingerprint function of the tensor kind decides the same
    by_prints = entry.xprint(x) == entry.xseen and (out is x or entry.oprint(out) == entry.oseen)
    assert by_prints is repeats, change


def test_a_tensor_layout_is_compared_as_memory_is_addressed():
    """A C-contiguous tensor's strides are compared as "C-contiguous": a length-1 dimension's
    stride, which addresses no other memory, may change; a Fortran-ordered pair is compared by
    its strides, and turning it C-ordered in place is a change."""
    torch = pytest.importorskip("torch")
    cache = Repeats()
    x, out = torch.ones(12, 1), torch.zeros(12, 1)
    entry = _remember(cache, x, out)
    x.as_strided_((12, 1), (1, 7))
    assert x.is_contiguous() and cache.find("allreduce", x, out, "sum", "auto", None, None) \
        is entry and entry.xprint(x) == entry.xseen
    f, g = torch.ones(4, 3).t(), torch.zeros(4, 3).t()  # (3, 4), Fortran order
    entry = _remember(cache, f, g)
    assert entry.xseen[2] == (1, 3)
    assert cache.find("allreduce", f, g, "sum", "auto", None, None) is entry
    g.as_strided_((3, 4), (4, 1))  # the same shape, C order: another layout of out
    assert cache.find("allreduce", f, g, "sum", "auto", None, None) is None
    assert entry.oprint(g) != entry.oseen


def test_entries_of_a_freed_communicator_are_dropped_at_the_next_remember():
    """A freed or reset communicator's entries never repeat; the next call remembered drops
    them, so that the context, lane and team they reference are not kept alive (the soak test
    in tests/mpi/mpi_shm.py measures the memory)."""
    cache = Repeats()
    arrays = [(np.zeros(3), np.zeros(3)) for _ in range(3)]
    first = _remember(cache, *arrays[0])
    second = _remember(cache, *arrays[1])
    first.where.live = False  # its communicator freed
    assert cache.find("allreduce", *arrays[0], "sum", "auto", None, None) is None
    assert first in cache.entries.values()  # nothing is dropped on the repeat path
    _remember(cache, *arrays[2])
    assert first not in cache.entries.values() and second in cache.entries.values()
    assert len(cache.entries) == 2
