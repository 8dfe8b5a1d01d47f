"""A team: ranks of one node that reduce through an MPI-3 shared window, synchronised by flags.

The window (``MPI.Win.Allocate_shared``, one segment per rank; layout in ``layout.py``) holds
each rank's control block, a scratch area and a few input and output slots. A call is split into
*rounds*; round ``t`` covers segment ``t`` of each of the ``m`` blocks of the vector (block ``b``
is reduced by rank ``b``). Rounds are numbered across calls, identically on every rank, so a
counter never needs resetting: a value left from an earlier call is always smaller than any
round of this one.

Per round, rank ``r`` does three things, each gated by the others' counters:

- **stage** (input not in shared memory): copy its segment of every other block into input slot
  ``t mod SLOTS``, then ``READY[r] = t``. The slot must first be free: ``DONE[q] >= t - SLOTS``
  for every rank ``q`` (none reads round ``t - SLOTS`` any more).
- **reduce** (``r < m``): once ``READY[q] >= t`` for every ``q``, combine segment ``t`` of block
  ``r`` from all ``p`` inputs in rank order, in one pass (``kernels.fold``), reading each input
  where it lies (its slot, or the rank's own shared buffer), and write the result to its own
  output, straight into every output that lies in shared memory, and into output slot
  ``t mod SLOTS`` if some rank needs to copy it (after ``FREED[q] >= t - SLOTS`` for all ``q``);
  then ``DONE[r] = t``.
- **copy out** (output not in shared memory): once ``DONE[b] >= t`` for all ``b``, copy every
  other block's segment of round ``t`` from the output slots, then ``FREED[r] = t``.

A step a rank does not take in a call (nothing to stage: its input is shared; nothing to reduce;
nothing to copy out) moves its counter to the call's last round at once, so that the invariants
hold in every mode: ``READY[q] >= t``: q's input of round t is readable and q's descriptor (where
its input and output lie, published before the first ``READY`` of the call, in one of two copies
by call parity) is current; ``DONE[q] >= t``: q reads no input of rounds <= t any more;
``FREED[q] >= t``: q reads no output slot of rounds <= t any more. A rank returns when it has
done its steps for the call's last round and every ``DONE`` has reached it, so no rank still
reads its input or writes its output. (In the replicated mode for short vectors, where every
rank reduces the whole vector for itself and no one writes another's output, a rank whose input
was staged returns without that wait: its slots are guarded by the ``DONE`` test of its next
stage, its descriptor by the parity.) That is the whole synchronisation: no barrier, and no MPI
call per round. The ``reduce-scatter`` and ``allgather`` modes of ``hierarchical`` take the
first and the last two steps only.

**Why it is correct under MPI's memory model.** The window is created with
``MPI_Win_allocate_shared``, whose memory model must be ``MPI_WIN_UNIFIED`` (checked: public and
private copies are one memory), and each process holds a shared lock on it
(``Lock_all(MODE_NOCHECK)``) from creation to ``Free``, a passive-target epoch within which
load/store access is allowed. For load/store access to a shared window the standard (MPI-3.1,
section 11.7, the advice to users and the shared-memory example added by MPI Forum ticket 413)
orders the accesses with ``MPI_Win_sync``, a memory barrier, on each side of a process
synchronisation, and leaves the synchronisation itself to the program. Here that synchronisation
is a flag in the window written with a *release* store after the data and read with an *acquire*
load before the data: the LLVM (C11) atomics defined for exactly this, which keep the compiler
from caching the polled flag or moving data accesses across it and order them in the processor,
as the two barriers of a ``Win_sync`` pair would (MPICH's and Open MPI's ``MPI_Win_sync`` on
shared memory are a processor memory barrier: ``MPL_atomic_read_write_barrier``,
``opal_atomic_mb``). The zeroed control blocks are published by ``Win_sync`` + ``Barrier`` +
``Win_sync``, the standard's own pattern. The non-temporal stores that copy long results out
are weakly ordered; they only write the rank's own private output, and a full fence follows them
before the call returns.

**Waiting.** ``kernels.engine`` polls the counters for a bounded number of rounds without
progress (about 100 us when the team has no more ranks than the machine has cores; under 1 us
when it has more), then returns to Python, which yields the
processor (``os.sched_yield``) and, once it has waited 2 ms without progress, sleeps 50 us
before calling it again; a rank that waits for one that is not scheduled (more ranks than
cores) thus gives it the core instead of spinning its time slice away.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from .._guard import active as _active_guard
from . import layout as L

__all__ = ["Team", "node_comm", "not_on_one_node", "OPCODES"]

OPCODES = L.OPCODES

#: Default slot size (``Options.shm_segment_bytes`` None) when the team's ranks have a core each,
#: and when they share cores (measured side by side at p = 4 on the loaded 2-core machine: 4 MiB
#: slots took 0.31-0.64x native's time, 1 MiB 0.38-0.77x, 256 KiB up to 3.8x; not in docs/).
SEGMENT_DEDICATED, SEGMENT_SHARED = 1 << 20, 4 << 20
#: Polls without progress (about 2 ns each) before the engine returns to Python to yield: about
#: 100 us when every rank of the team can have a core of its own, well under 1 us when they
#: cannot (then the rank waited for may need this very core). Spinning for milliseconds was
#: 3-4x slower on a machine shared with other jobs, whose processes then wait behind ours.
SPIN_DEDICATED, SPIN_SHARED = 50_000, 200
#: Waiting longer than this (seconds) in one call, yield by sleeping instead.
YIELD_FOR = 2e-3
NAP = 50e-6

_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_KERNELS: Any = None


def _kernels():
    """The Numba kernels, imported (and Numba with them) on first use."""
    global _KERNELS
    if _KERNELS is None:
        from . import kernels

        _KERNELS = kernels
    return _KERNELS


def node_comm(comm: MPI.Comm, node_size: int | None) -> MPI.Comm:
    """The ranks of ``comm`` on this rank's node (collective): ``Split_type(COMM_TYPE_SHARED)``,
    cut into emulated nodes of ``node_size`` ranks when given. Ranks keep ``comm``'s order."""
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    if node_size is None:
        return shared
    node = shared.Split(shared.rank // node_size, shared.rank)
    shared.Free()
    return node


def not_on_one_node(comm: MPI.Comm, node_size: int | None) -> str | None:
    """None if every rank of ``comm`` is on one (emulated) node, else why not (collective;
    every rank gets the same text, naming the ranks not on rank 0's node)."""
    node = node_comm(comm, node_size)
    leader = node.bcast(comm.rank, root=0)  # the node's lowest rank of comm names the node
    node.Free()
    leaders = comm.allgather(leader)
    others = [r for r, lead in enumerate(leaders) if lead != leaders[0]]
    if not others:
        return None
    what = "shared-memory node" if node_size is None else f"emulated node of {node_size} ranks"
    return (f"algorithm 'shm' needs every rank of the communicator on one {what}; rank"
            f"{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} of {comm.size} "
            f"{'are' if len(others) > 1 else 'is'} not on rank 0's node (use 'hierarchical' "
            f"across nodes)")


class Team:
    """The ranks of ``comm`` (all on one node) with their shared window and round counters.

    ``slot_bytes``: requested segment size (``Options.shm_segment_bytes``; None: the default for
    whether the team's ranks have a core each). ``buffers``: the
    registry of ``collectives.empty`` arrays whose ranks' buffers this team may read and write
    in place (None: every buffer is staged). Collective; :meth:`free` releases the window.
    """

    def __init__(self, comm: MPI.Comm, slot_bytes: int | None, buffers: Any = None) -> None:
        p, me = comm.size, comm.rank
        if p > L.MAX_TEAM:
            raise ValueError(f"shared-memory collectives take at most {L.MAX_TEAM} ranks per "
                             f"node, got {p}")
        self.comm, self.size, self.buffers = comm, p, buffers
        dedicated = p <= (os.cpu_count() or 1)
        if slot_bytes is None:
            slot_bytes = SEGMENT_DEDICATED if dedicated else SEGMENT_SHARED
        slot = L.segment_bytes(slot_bytes, p)
        self.win = MPI.Win.Allocate_shared(L.DATA_OFFSET + 2 * L.SLOTS * slot, 1, comm=comm)
        if self.win.Get_attr(MPI.WIN_MODEL) != MPI.WIN_UNIFIED:  # pragma: no cover - no such MPI
            self.win.Free()
            raise RuntimeError("algorithm 'shm' needs MPI shared windows in the unified memory "
                               "model; this MPI library's are separate")
        self.win.Lock_all(MPI.MODE_NOCHECK)
        mine = np.frombuffer(self.win.Shared_query(me)[0], np.uint8)
        mine[:L.CTRL_BYTES] = 0
        self.win.Sync()
        comm.Barrier()
        self.win.Sync()
        self.tab = np.zeros(L.T_BASE + p, np.int64)
        spin = SPIN_DEDICATED if dedicated else SPIN_SHARED
        self.tab[[L.T_ME, L.T_P, L.T_SLOTS, L.T_SLOT_BYTES, L.T_SPIN]] = (me, p, L.SLOTS, slot,
                                                                          spin)
        self.tab[L.T_STREAM] = L.STREAM_BYTES
        self.tab[L.T_BASE:] = [self.win.Shared_query(q)[0].address for q in range(p)]
        self._ranks = (None if buffers is None else
                       buffers.translate(comm))  # team rank -> rank in the buffers' node
        self._regions = np.zeros((0, 1 + p), np.int64)
        self._version = -1

    def regions(self) -> np.ndarray:
        """The shared buffers this team can address: per row my size, then every rank's base."""
        if self.buffers is not None and self._version != self.buffers.version:
            self._regions = self.buffers.regions(self._ranks)
            self._version = self.buffers.version
        return self._regions

    def run(self, x: np.ndarray, out: np.ndarray, opcode: int, mode: int, m: int) -> None:
        """One collective call of this rank over flat contiguous host arrays (see ``layout``)."""
        engine = _kernels().engine
        if out.dtype == np.float16:  # Numba has no float16: uint16 words and a format token
            token = _kernels().FLOAT16
            x, out = x.view(np.uint16), out.view(np.uint16)
        else:
            token = out
        regions = self.regions()
        tab = self.tab
        tab[L.T_PHASE] = 0
        if engine(tab, regions, x, out, token, opcode, mode, m):
            return
        since, cursor = time.perf_counter(), None  # waiting without progress since
        while True:
            moved = tab[L.T_TS] + tab[L.T_TF] + tab[L.T_TC]
            if moved != cursor:
                since, cursor = time.perf_counter(), moved
            if time.perf_counter() - since < YIELD_FOR:
                _yield()
            else:
                time.sleep(NAP)
                guard = _active_guard()  # a rank that failed this call will never arrive:
                if guard is not None and guard.notice.Test():  # its notice raises here
                    guard._read_notice()
            if engine(tab, regions, x, out, token, opcode, mode, m):
                return

    def free(self) -> None:
        """Release the window (collective over the team's communicator)."""
        if self.win != MPI.WIN_NULL:
            self.win.Unlock_all()
            self.win.Free()
