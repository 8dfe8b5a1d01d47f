"""The library's state on a caller's communicator, under one MPI attribute.

A communicator the library works on carries its private context (:mod:`.context`) and, once a
non-blocking call ran on it, its progress engine (:mod:`collectives.engine.lifecycle`). Both hang
off the communicator under one keyval, as the fields of a :class:`Slots`; its delete callback
frees them in :data:`ORDER` (the engine first: its operations run on the context's
communicators) when the communicator is freed. The hooks the library runs inside
``MPI_Finalize`` run from the deletion of ``MPI_COMM_SELF``'s slots, set at import
(:func:`at_finalize`), so that communicator too carries one attribute of ours.

Why one attribute, not one per module: MPICH deletes a communicator's attributes one by one and
empties the list only after the last (``MPIR_Attr_delete_list``), and mpi4py wraps the handle in
a Python object for each delete callback, which calls ``MPI_Topo_test``. Once any topology
communicator has existed in the process (a distributed graph of ``neighbor_allgather``'s "mpi"
backend, a caller's Cartesian one), ``MPI_Topo_test`` looks the topology up in that same list: a
second callback walks the entry freed before it, and crashes when the freed entry's keyval
pointer was reset (a segmentation fault in ``Comm.Free()``, depending on MPICH's pool of
attribute objects; ``tests/test_comm_state.py`` makes it happen). With a single attribute of ours
there is no entry of ours freed before our callback. (An attribute the caller sets on the same
communicator after the library's first call there is deleted before ours, and can still make
mpi4py's wrapping of our callback crash: that one is MPICH's and mpi4py's to fix.)
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from mpi4py import MPI

__all__ = ["ORDER", "Slots", "get", "put", "drop", "register", "at_finalize"]

#: the fields of :class:`Slots`, in the order the communicator's deletion frees them
ORDER = ("engine", "context")


class Slots:
    """What the library keeps on one communicator: a field per name of :data:`ORDER`."""

    __slots__ = ORDER

    def __init__(self) -> None:
        self.engine = self.context = None


#: name -> what frees that field's value, ``free(comm, value)`` (:func:`register`)
_FREE: dict[str, Callable[[MPI.Comm, Any], None]] = {}
#: name -> what runs inside ``MPI_Finalize`` (:func:`at_finalize`), run in :data:`ORDER`
_FINALIZE: dict[str, Callable[[], None]] = {}
_LOCK = threading.Lock()


def register(name: str, free: Callable[[MPI.Comm, Any], None]) -> None:
    """Make ``free(comm, value)`` free field ``name``'s value when its communicator is freed."""
    if name not in ORDER:
        raise ValueError(f"unknown slot {name!r}; valid: {', '.join(ORDER)}")
    _FREE[name] = free


def _delete(comm: MPI.Comm, keyval: int, slots: Slots) -> None:
    if comm == MPI.COMM_SELF:  # MPI_Finalize has begun: its hooks first
        for name in ORDER:
            hook = _FINALIZE.get(name)
            if hook is not None:
                hook()
    for name in ORDER:
        value = getattr(slots, name)
        if value is not None:
            setattr(slots, name, None)
            _FREE[name](comm, value)


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)


def get(comm: MPI.Comm, name: str) -> Any:
    """Field ``name`` of ``comm``'s slots; None when not set."""
    slots = comm.Get_attr(_KEYVAL)
    return None if slots is None else getattr(slots, name)


def put(comm: MPI.Comm, name: str, value: Any) -> None:
    """Set field ``name`` of ``comm``'s slots (the attribute is set at the first field; setting
    it again would free the fields already there, so it is set once, under a lock)."""
    with _LOCK:
        slots = comm.Get_attr(_KEYVAL)
        if slots is None:
            slots = Slots()
            comm.Set_attr(_KEYVAL, slots)
        setattr(slots, name, value)


def drop(comm: MPI.Comm, name: str) -> None:
    """Free field ``name``'s value now, as freeing ``comm`` would, and clear the field."""
    with _LOCK:
        slots = comm.Get_attr(_KEYVAL)
        value = None if slots is None else getattr(slots, name)
        if value is not None:
            setattr(slots, name, None)
    if value is not None:
        _FREE[name](comm, value)


def at_finalize(name: str, hook: Callable[[], None]) -> None:
    """Run ``hook()`` inside ``MPI_Finalize``, when ``MPI_COMM_SELF``'s attributes are deleted:
    the hooks in :data:`ORDER`, then ``MPI_COMM_SELF``'s own fields are freed."""
    if name not in ORDER:
        raise ValueError(f"unknown slot {name!r}; valid: {', '.join(ORDER)}")
    _FINALIZE[name] = hook


put(MPI.COMM_SELF, "context", None)  # COMM_SELF's slots, set now: its deletion runs the hooks
