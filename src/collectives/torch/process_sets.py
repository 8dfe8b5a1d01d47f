"""Horovod's process sets: collectives over a subset of the ranks, as MPI communicators.

``even = hvd.add_process_set([0, 2])`` (every rank calls it, in the same order) makes a
:class:`ProcessSet`; ``hvd.allreduce(t, process_set=even)`` on ranks 0 and 2 then reduces over
those two. Underneath, a process set is a communicator: ``add_process_set`` splits
:func:`~collectives.torch.basics.default_comm` with ``Comm.Split`` (ranks outside the set get
``MPI.COMM_NULL``), and :data:`global_process_set` is the default communicator itself. Each set
also keeps a duplicate of its communicator, its *control* communicator, on which Horovod's
calls agree what they do before they move data (:mod:`.negotiation`), so user traffic on the
communicator itself never meets it.

Ranks are ranks of the default communicator (``hvd.rank()``); ``ps.rank()`` is the rank within
the set. Sets are numbered in the order they are added (``process_set_id``; the global set
is 0). ``remove_process_set`` frees the communicators (collective, as adding is).
"""

from __future__ import annotations

from typing import Any, Sequence

from mpi4py import MPI

from .basics import default_comm, on_shutdown

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
           "comm_of", "control_of", "resolve"]


class ProcessSet:
    """A set of ranks that Horovod's calls run over (``process_set=``).

    ``ProcessSet([0, 2])`` only names the ranks; :func:`add_process_set` registers it (and
    creates its communicators); ``ProcessSet(comm)`` takes the ranks of an mpi4py communicator.
    """

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        self.process_set_id: int | None = None
        self._comm: Any = None
        self._control: Any = None
        if isinstance(ranks_or_comm, MPI.Comm):
            world = default_comm()
            ranks = MPI.Group.Translate_ranks(ranks_or_comm.Get_group(),
                                              list(range(ranks_or_comm.size)), world.Get_group())
            self.ranks: list[int] | None = sorted(ranks)
        elif ranks_or_comm is None:
            self.ranks = None  # the global set: every rank of the default communicator
        else:
            ranks = sorted(int(r) for r in ranks_or_comm)
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"a process set's ranks must be distinct, got {list(ranks_or_comm)}")
            self.ranks = ranks

    def _ranks(self) -> list[int]:
        return list(range(default_comm().size)) if self.ranks is None else self.ranks

    def size(self) -> int:
        """How many ranks the set has."""
        return len(self._ranks())

    def included(self) -> bool:
        """Whether this rank is in the set."""
        return default_comm().rank in self._ranks()

    def rank(self) -> int:
        """This rank's rank within the set (ValueError outside it)."""
        mine = default_comm().rank
        if mine not in self._ranks():
            raise ValueError(f"rank {mine} is not in process set {self.process_set_id} "
                             f"(ranks {self._ranks()})")
        return self._ranks().index(mine)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id
                and self.ranks == other.ranks)

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self.ranks or ())))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


#: Every rank of the default communicator (Horovod's ``hvd.global_process_set``).
global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0

_SETS: dict[int, ProcessSet] = {}  # id -> the sets added (not the global one)
_GLOBAL_CONTROL: list[Any] = [None, None]  # (the default communicator, its duplicate)


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (a :class:`ProcessSet` or its ranks) and return it; collective over
    the default communicator: every rank calls it, in the same order. A set with the same ranks
    as one registered already raises a ``ValueError``, as Horovod's does."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    world = default_comm()
    if ps.ranks is None or any(r < 0 or r >= world.size for r in ps.ranks) or not ps.ranks:
        raise ValueError(f"a process set needs ranks in 0..{world.size - 1}, got {ps.ranks}")
    if any(other.ranks == ps.ranks for other in _SETS.values()):
        raise ValueError(f"a process set with ranks {ps.ranks} is registered already")
    member = world.rank in ps.ranks
    comm = world.Split(0 if member else MPI.UNDEFINED, world.rank)
    ps._comm = comm if member else None
    ps._control = comm.Dup() if member else None
    ps.process_set_id = max(_SETS, default=0) + 1
    _SETS[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set added by :func:`add_process_set` and free its communicators
    (collective over its members). False if it was not registered (or is the global set)."""
    ps = _SETS.pop(process_set.process_set_id, None) if process_set.process_set_id else None
    if ps is None:
        return False
    for comm in (ps._control, ps._comm):
        if comm is not None:
            comm.Free()
    ps._comm = ps._control = None
    process_set.process_set_id = None
    return True


def resolve(process_set: ProcessSet | None, comm: Any = None) -> ProcessSet:
    """The set a call runs over: ``process_set``, else the global set (``comm``, our own
    argument, may name the communicator instead, as a set of its ranks not registered)."""
    if comm is not None:
        if process_set is not None:
            raise ValueError("pass process_set= (Horovod's) or comm=, not both")
        ps = ProcessSet(None)
        ps._comm = comm
        return ps
    return global_process_set if process_set is None else process_set


def comm_of(process_set: ProcessSet) -> Any:
    """The communicator of ``process_set`` on this rank (ValueError if this rank is outside it)."""
    if process_set.ranks is None and process_set._comm is None:
        return default_comm()
    if process_set._comm is None:
        if process_set.process_set_id is None:
            raise ValueError(f"{process_set!r} is not registered: call add_process_set() first")
        raise ValueError(f"rank {default_comm().rank} is not in process set "
                         f"{process_set.process_set_id} (ranks {process_set.ranks})")
    return process_set._comm


def control_of(process_set: ProcessSet) -> Any:
    """The set's control communicator (a duplicate of :func:`comm_of`, made on first use for the
    global set and for a ``comm=`` set: every rank's first Horovod call is collective)."""
    if process_set._control is not None:
        return process_set._control
    comm = comm_of(process_set)
    if process_set is global_process_set or process_set.ranks is None:
        cached, control = _GLOBAL_CONTROL if process_set is global_process_set else (None, None)
        if cached is not comm:
            control = comm.Dup()
            if process_set is global_process_set:
                _GLOBAL_CONTROL[:] = [comm, control]
            else:
                process_set._control = control
        return control
    return process_set._control


def _forget() -> None:
    for ps in list(_SETS.values()):
        remove_process_set(ps)
    _GLOBAL_CONTROL[:] = [None, None]


on_shutdown(_forget)
