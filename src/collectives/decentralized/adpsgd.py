"""Asynchronous pairwise averaging over one-sided windows: the gossip step of AD-PSGD (Lian et al.
2018, "Asynchronous Decentralized Parallel Stochastic Gradient Descent", ICML).

Every rank's model lives in an MPI window of its own memory (``MPI_Win_allocate``, one slot of
``n`` elements). A worker ``i`` repeats, with no global step and no barrier:

1. **read** its model (:attr:`PairwiseAveraging.value`) and compute a gradient on that copy;
2. **pick** a neighbor ``j`` of the graph uniformly at random (:meth:`PairwiseAveraging.peer`,
   a pure function of ``(seed, rank, step)``, so a run and its resumption pick alike);
3. **average** atomically (:meth:`PairwiseAveraging.average`): lock the windows of ``i`` and
   ``j`` exclusively, *in ascending rank order*, read both models (``MPI_Get`` + flush), write
   ``m = (x_i + x_j) / 2`` into ``j``'s window and ``m + delta`` into ``i``'s (``delta``: ``i``'s
   update from its gradient, the paper's ``x_i <- x_i - gamma g``), unlock both.

Why it is atomic and never deadlocks. While ``i`` holds both exclusive locks no other rank can
read or write either model, so every pairwise average sees, and leaves, a consistent pair: with
``delta = 0`` the sum over all ranks of the models is invariant (exactly, in binary floating
point: halving is exact and ``x_i + x_j`` is exact while the values need no more bits than the
mantissa has). Each lock is acquired (its ``Get`` flushed) before the next is requested, and
every rank requests them in ascending rank order, so no cycle of ranks can wait on each other
(resource ordering); the paper reaches the same end with a bipartite graph of active and passive
workers, which these one-sided locks make unnecessary: the peer takes no part in the average,
it only finds its window changed when it next reads it. Locks aimed at a rank that is computing
are granted by the progress thread (``_runtime/rma_progress``).

Cost of one average: two lock/unlock pairs, a get and a put of ``n`` elements to and from the
peer (``2 n`` bytes of traffic, ``n`` each way) and a get and put of the own window (a local
copy), plus ``2 n`` flops. A rank waits only while its peer (or a rank averaging with it) holds
a lock: one such average at most per lock, with no global wait.

Checks (before anything is allocated, every rank raising the same error together): ``x`` is a
contiguous 1-D float32 or float64 array of the same size and dtype on every rank; the topology
is a static :class:`~collectives.topology.Topology` for the communicator's size (a rank's
neighbors are its in- and out-neighbors, so a directed graph is used undirected).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..options import Options
from .one_sided import OneSided
from .topology import Topology, ring

__all__ = ["PairwiseAveraging"]

_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE}


class PairwiseAveraging(OneSided):
    """Every rank's model in a window; atomic pairwise averages with random neighbors (see the
    module).

    Parameters
    ----------
    x
        This rank's initial model: a contiguous 1-D float32 or float64 NumPy array, the same size
        and dtype on every rank. Collective.
    topology
        The static graph whose edges may average (default: the ring over ``comm.size`` ranks).
    comm
        Intracommunicator (default ``MPI.COMM_WORLD``).
    seed
        Seed of the neighbor choice (the same on every rank).
    """

    def __init__(self, x: np.ndarray, topology: Topology | None = None, *,
                 comm: MPI.Comm | None = None, seed: int = 0,
                 options: Options | None = None) -> None:
        size = (MPI.COMM_WORLD if comm is None else comm).size
        graph = ring(size) if topology is None else topology

        def check() -> tuple[None, dict[str, Any]]:
            if not isinstance(x, np.ndarray) or x.ndim != 1 or not x.flags.c_contiguous \
                    or x.dtype not in _TYPES:
                raise TypeError("PairwiseAveraging: x must be a contiguous 1-D float32 or "
                                f"float64 NumPy array, got "
                                f"{getattr(x, 'dtype', type(x).__name__)}"
                                f"{'' if not isinstance(x, np.ndarray) else f' {x.shape}'}")
            if not isinstance(graph, Topology):
                raise TypeError("PairwiseAveraging: topology must be a "
                                "collectives.topology.Topology, got "
                                f"{type(graph).__name__}")
            graph.check_size(size, "PairwiseAveraging")
            if graph.dynamic:
                raise ValueError(f"PairwiseAveraging: {graph.name} changes every step; "
                                 "pairwise averaging needs a static graph")
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise TypeError(f"PairwiseAveraging: seed must be an integer, got {seed!r}")
            return None, {"size": x.size, "dtype": str(x.dtype), "seed": int(seed),
                          "topology": graph.fingerprint}

        self._open(comm, options, check)  # every rank raises the same error, together
        self.topology, self.seed = graph, int(seed)
        self.dtype, self.size = x.dtype, x.size
        me = self.comm.rank
        #: the ranks this one may average with, ascending
        self.neighbors = tuple(sorted(set(graph.in_neighbors(me)) | set(graph.out_neighbors(me))))
        self._type = _TYPES[x.dtype]
        item = x.dtype.itemsize
        self._win = self._window(max(x.size, 1) * item, item)
        mem = np.frombuffer(self._win.tomemory(), dtype=x.dtype)[:x.size]
        self._win.Lock(me, MPI.LOCK_EXCLUSIVE)
        mem[...] = x
        self._win.Unlock(me)
        self._mine = np.empty(x.size, x.dtype)    # the two models while they are averaged
        self._theirs = np.empty(x.size, x.dtype)
        #: statistics of this rank: averages done, elements moved to and from peers
        self.averages = 0
        self.elements_moved = 0
        self.comm.Barrier()  # every window holds its model before anyone reads one

    # -- what this rank holds ----------------------------------------------------------------------
    @property
    def value(self) -> np.ndarray:
        """This rank's model now (a copy, read under its exclusive lock: never half-written)."""
        self._live()
        me = self.comm.rank
        out = np.empty(self.size, self.dtype)
        self._win.Lock(me, MPI.LOCK_EXCLUSIVE)
        try:
            self._win.Get([out, self._type], me)
        finally:
            self._win.Unlock(me)
        return out

    def assign(self, x: np.ndarray) -> None:
        """Replace this rank's model (not collective)."""
        self._live()
        self._shape(x, "assign")
        me = self.comm.rank
        src = np.ascontiguousarray(x, dtype=self.dtype)
        self._win.Lock(me, MPI.LOCK_EXCLUSIVE)
        try:
            self._win.Put([src, self._type], me)
        finally:
            self._win.Unlock(me)

    def peer(self, step: int) -> int | None:
        """The neighbor this rank averages with at ``step``: uniform over :attr:`neighbors`,
        drawn from ``(seed, rank, step)``; None without neighbors (one rank)."""
        if not self.neighbors:
            return None
        rng = np.random.default_rng((self.seed, self.comm.rank, int(step)))
        return self.neighbors[int(rng.integers(len(self.neighbors)))]

    # -- the pairwise average ----------------------------------------------------------------------
    def average(self, peer: int | None, delta: np.ndarray | None = None) -> np.ndarray:
        """Atomically replace this rank's and ``peer``'s models by their mean, then add
        ``delta`` (if given) to this rank's; returns this rank's new model (a copy). ``peer``
        None (or this rank) only adds ``delta``."""
        self._live()
        me = self.comm.rank
        if peer is not None and peer != me and peer not in self.neighbors:
            raise ValueError(f"PairwiseAveraging: rank {peer!r} is not a neighbor of rank {me} "
                             f"in {self.topology.name} (neighbors {list(self.neighbors)})")
        if delta is not None:
            self._shape(delta, "average")
        mine, theirs = self._mine, self._theirs
        if peer is None or peer == me:
            pair = (me,)
        else:
            pair = (min(me, peer), max(me, peer))
        win, t = self._win, self._type
        locked = []
        try:
            for r in pair:  # ascending: each lock held (its get flushed) before the next
                win.Lock(r, MPI.LOCK_EXCLUSIVE)
                locked.append(r)
                win.Get([mine if r == me else theirs, t], r)
                win.Flush(r)
            if len(pair) == 2:
                mine += theirs
                mine *= self.dtype.type(0.5)  # exact: a halving
                win.Put([mine, t], peer)      # the peer's model: the mean
            if delta is not None:
                mine += delta.astype(self.dtype, copy=False)
            win.Put([mine, t], me)
        finally:
            for r in reversed(locked):
                win.Unlock(r)
        if len(pair) == 2:
            self.averages += 1
            self.elements_moved += 2 * self.size
        return mine.copy()

    def _released(self) -> None:
        self._win = None

    # -- checks --------------------------------------------------------------------------------------
    def _shape(self, x: object, what: str) -> None:
        if not isinstance(x, np.ndarray) or x.shape != (self.size,):
            raise ValueError(f"PairwiseAveraging.{what}: expected a NumPy array of shape "
                             f"({self.size},), got {getattr(x, 'shape', type(x).__name__)}")
