"""A recorder of what the hand-written collectives do, message by message (off by default).

While :func:`recording` is active, every point-to-point operation of :mod:`.p2p` (a send, a
receive, or a send-receive pair) appends one :class:`Event` to this process's list, in program
order, with the peers as ranks of the recording's communicator (messages on a node's or a
position's sub-communicator are translated), and every round trip through a node's shared window
(``shmem.team.Team.run``; a repeated call's lane runs it too while an observer listens: the
``shm`` algorithm, and ``hierarchical``'s phases inside the node) appends one event naming its mode and
the ranks of the node. ``collectives.tools.osu.schedule`` turns the events of all ranks into steps
and draws them (docs/algorithms.md).

The recorder is an observer (:mod:`.observe`): :func:`recording` registers it on the points
``p2p`` (before each message is posted) and ``shm`` (at the end of each pass, inside which no
message is sent) and unregisters it when the block ends; off, each point costs one test of an
empty tuple. One recording at a time, on the thread that makes the calls (the progress
engine's thread is not meant to run while recording).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from mpi4py import MPI

from ..observe import register, unregister

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

    def window(self, comm: MPI.Comm, mode: int, nbytes: int, t0: float, t1: float) -> None:
        """A pass through ``comm``'s shared window in ``mode`` (``shmem.layout``'s constants;
        ``nbytes`` and the times are not recorded)."""
        ranks = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.size)), self.group)
        self.events.append(Event(f"shm {_MODES[mode]}", group=tuple(ranks)))


def _modes() -> dict[int, str]:
    from .shmem import layout

    return {layout.FUSED: "allreduce", layout.REPLICATED: "allreduce (replicated)",
            layout.REDUCE_SCATTER: "reduce-scatter", layout.ALLGATHER: "allgather",
            layout.ALLTOALL: "alltoall", layout.ALLTOALL_CMA: "alltoall (cross-memory attach)"}


_MODES: dict[int, str] = {}


#: The recording in progress, or None (the default).
ACTIVE: Recorder | None = None


@contextmanager
def recording(comm: MPI.Comm) -> Iterator[list[Event]]:
    """Record this process's operations until the block ends; yields the list that fills up."""
    global ACTIVE
    if ACTIVE is not None:
        raise RuntimeError("a recording is already active")
    if not _MODES:
        _MODES.update(_modes())
    rec = ACTIVE = Recorder(comm)
    register("p2p", rec.message)
    register("shm", rec.window)
    try:
        yield rec.events
    finally:
        unregister("shm", rec.window)
        unregister("p2p", rec.message)
        ACTIVE = None
