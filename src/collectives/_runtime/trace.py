"""A recorder of what the hand-written collectives do, message by message (off by default).

While :func:`recording` is active, every point-to-point operation of :mod:`.p2p` (a send, a
receive, or a send-receive pair) appends one :class:`Event` to this process's list, in program
order, with the peers as ranks of the recording's communicator (messages on a node's or a
position's sub-communicator are translated), and every round trip through a node's shared window
(``shmem.team.Team.run``, or ``Team.run_compiled`` for a repeated call's lane: the ``shm``
algorithm, and ``hierarchical``'s phases inside the node) appends one event naming its mode and
the ranks of the node. ``collectives.tools.osu.schedule`` turns the events of all ranks into steps
and draws them (docs/algorithms.md).

Off, it costs one test of a module global per message (``ACTIVE is None``) and nothing on the
shared-memory path: :func:`recording` wraps ``Team.run`` and ``Team.run_compiled`` on the class
only while it is active.
One recording at a time, on the thread that makes the calls (the progress engine's thread is not
meant to run while recording).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from mpi4py import MPI

__all__ = ["Event", "Recorder", "ACTIVE", "recording"]


@dataclass(frozen=True)
class Event:
    """One operation of this rank: a message exchange, or a pass through the node's window.

    ``dest``/``source`` are ranks of the recording's communicator (-1: no send / no receive);
    ``kind`` is ``"p2p"`` or the shared-memory mode (``"shm reduce-scatter"``, ...), whose
    participants are ``group``.
    """

    kind: str
    dest: int = -1
    sent: int = 0
    source: int = -1
    received: int = 0
    group: tuple[int, ...] = ()


class Recorder:
    """The events of one recording on this process, with peers translated to ``comm``'s ranks."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.group = comm.Get_group()
        self.events: list[Event] = []

    def _rank(self, comm: MPI.Comm, peer: int) -> int:
        return MPI.Group.Translate_ranks(comm.Get_group(), [peer], self.group)[0]

    def message(self, comm: MPI.Comm, dest: int, sent: int, source: int, received: int) -> None:
        """A send of ``sent`` bytes to ``dest`` and/or a receive from ``source`` (-1: none)."""
        self.events.append(Event("p2p", self._rank(comm, dest) if dest >= 0 else -1, sent,
                                 self._rank(comm, source) if source >= 0 else -1, received))

    def window(self, comm: MPI.Comm, mode: str) -> None:
        ranks = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.size)), self.group)
        self.events.append(Event(f"shm {mode}", group=tuple(ranks)))


#: The recorder in use, or None (the default): what ``p2p`` tests before recording.
ACTIVE: Recorder | None = None


@contextmanager
def recording(comm: MPI.Comm) -> Iterator[list[Event]]:
    """Record this process's operations until the block ends; yields the list that fills up."""
    global ACTIVE
    from .shmem import layout
    from .shmem.team import Team

    if ACTIVE is not None:
        raise RuntimeError("a recording is already active")
    names = {layout.FUSED: "allreduce", layout.REPLICATED: "allreduce (replicated)",
             layout.REDUCE_SCATTER: "reduce-scatter", layout.ALLGATHER: "allgather"}
    plain, plain_compiled = Team.run, Team.run_compiled
    rec = Recorder(comm)

    def window(original, first):  # mode: argument first + 3 (run: 0; run_compiled: 1, the entry)
        def method(team, *args, **kwargs):
            rec.window(team.comm, names[args[first + 3]])
            return original(team, *args, **kwargs)
        return method

    Team.run, Team.run_compiled = window(plain, 0), window(plain_compiled, 1)
    ACTIVE = rec
    try:
        yield rec.events
    finally:
        ACTIVE = None
        Team.run, Team.run_compiled = plain, plain_compiled
