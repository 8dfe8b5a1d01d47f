"""The observation points (``collectives.observe``): registering, unregistering, refusals.

One process: the points are reached through the library's own code (a reduction, a call on
``COMM_SELF``'s guard, a compressed allreduce's codec work), never by calling observers by hand.
"""

import re
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import observe
from collectives._runtime.context import context
from collectives.ops import OPS

SRC = Path(__file__).resolve().parent.parent / "src" / "collectives"


def test_an_observer_hears_its_point_until_it_is_unregistered():
    heard = []

    def reduced(op, nbytes, t0, t1):
        heard.append((op, nbytes, t1 >= t0))

    a, b = np.ones(4), np.ones(4)
    assert observe.OBSERVERS.reduce == ()
    observe.register("reduce", reduced)
    try:
        assert observe.OBSERVERS.reduce == (reduced,)
        OPS["max"].combine(a, b, a)
        assert heard == [("max", 32, True)]
    finally:
        assert observe.unregister("reduce", reduced) is True
    assert observe.OBSERVERS.reduce == ()
    OPS["sum"].combine(a, b, a)
    assert heard == [("max", 32, True)]  # no longer called
    assert observe.unregister("reduce", reduced) is False  # not registered any more


def test_observers_are_called_in_order_and_see_a_failed_call():
    """Two observers of ``call`` on a guard's call, in registration order, with the error's type
    when the call raises; a registered bound method is unregistered by an equal one."""
    order = []

    class Watcher:
        def __init__(self, label):
            self.label = label

        def call(self, name, t0, t1, seq, what, call, error):
            order.append((self.label, name, seq, error))

    first, second = Watcher("first"), Watcher("second")
    guard = context(MPI.COMM_SELF).guard
    observe.register("call", first.call)
    observe.register("call", second.call)
    try:
        guard.run("allreduce", lambda: None)
        seq = guard.seq
        with pytest.raises(KeyError):
            guard.run("bcast", {}.__getitem__, "missing")
    finally:
        assert observe.unregister("call", first.call)  # a new bound method, equal to the first
        assert observe.unregister("call", second.call)
    assert order == [("first", "allreduce", seq, None), ("second", "allreduce", seq, None),
                     ("first", "bcast", seq + 1, "KeyError"),
                     ("second", "bcast", seq + 1, "KeyError")]
    assert observe.OBSERVERS.call == ()


def test_codec_phases_are_observed_inside_a_compressed_allreduce():
    """Encode, then the aggregation, which ends after the decode inside it."""
    phases = []

    def codec(phase, t0, t1):
        phases.append(phase)

    observe.register("codec", codec)
    try:
        collectives.compressed_allreduce(np.ones(64, np.float32), "none", comm=MPI.COMM_SELF)
    finally:
        observe.unregister("codec", codec)
    assert phases == ["encode", "decode", "aggregate"]


def test_register_refuses_unknown_points_non_callables_and_wrong_arities():
    with pytest.raises(ValueError, match="unknown observation point 'calls'; valid points: "
                                         "call, submit"):
        observe.register("calls", print)
    with pytest.raises(ValueError, match="unknown observation point"):
        observe.unregister(None, print)
    with pytest.raises(TypeError, match="must be callable"):
        observe.register("call", 42)
    with pytest.raises(TypeError, match=r"'reduce' is called with 4 positional arguments "
                                        r"\(ReduceObserver\)"):
        observe.register("reduce", lambda op, nbytes: None)
    observe.register("reduce", lambda *args: None)  # any arity
    observe.unregister("reduce", observe.OBSERVERS.reduce[-1])
    assert observe.OBSERVERS.reduce == ()


def test_every_point_is_a_slot_and_is_read_by_the_library():
    """Each point of the table is an attribute of OBSERVERS, and some module of the library
    reads it (a point nobody reaches would be a promise the library does not keep)."""
    assert set(observe.Observers.__slots__) == set(observe.POINTS) | {"_lock"}
    code = "\n".join(p.read_text() for p in SRC.rglob("*.py") if p.name != "observe.py")
    read = set(re.findall(r"\b_?OBSERVE[RD]S?\.(\w+)", code))
    assert set(observe.POINTS) <= read, set(observe.POINTS) - read
    # at import, only the timeline's Options hook and the flight recorder's dumps and
    # point-to-point records are registered
    busy = {p for p in observe.POINTS if getattr(observe.OBSERVERS, p)}
    assert busy == {"timeline_option", "dump", "pt2pt"}, observe.OBSERVERS
