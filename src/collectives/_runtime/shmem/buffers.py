"""``collectives.empty`` / ``collectives.zeros``: arrays that live in the node's shared memory.

Each call is collective over ``comm`` (like ``MPI_Win_allocate_shared``, which it calls on the
node's ranks of ``comm``): every rank gets its own array, but the memory is one segment of a
shared window, so the ``shm`` collectives on ``comm`` read a rank's input and write its result
in place instead of copying them through the staging slots.

The windows are registered in the communicator's private context (the registry below); a team
looks a caller's array up by address (``kernels.protocol._find``), so any view of such an array works.
Windows are freed collectively: when the communicator is freed, or at a later ``empty`` /
``zeros`` call on it once every rank has dropped every reference to an array (the ranks agree
on which with one small allreduce), so allocating one per training step does not grow memory.
An array must not be used after its communicator is freed (its memory is gone, as after
``MPI_Win_free``).
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from ..context import Context, context

__all__ = ["Buffers", "registry", "empty", "zeros"]

_KEY = "shm-buffers"


class _Window:
    """One shared window backing one array on every rank of the node."""

    def __init__(self, node: MPI.Comm, nbytes: int) -> None:
        size = max(64, -(-nbytes // 64) * 64)  # every rank's segment starts cache-line aligned
        self.win = MPI.Win.Allocate_shared(size, 1, comm=node)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        segments = [self.win.Shared_query(q)[0] for q in range(node.size)]
        self.sizes = [len(s) for s in segments]
        self.bases = [s.address for s in segments]
        # Every view of the array hands back (NumPy collapses view chains to the first array
        # that is not a view of another array), so this one is alive while any view is.
        memory = np.frombuffer(segments[node.rank], np.uint8)
        self.alive = weakref.ref(memory)
        self.array: np.ndarray | None = memory[:nbytes]

    def free(self) -> None:
        self.win.Unlock_all()
        self.win.Free()


class Buffers:
    """The shared arrays of one communicator (cached in its context; freed with it)."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        self.windows: list[_Window] = []
        self.version = 0  # changes whenever the set of windows does

    def allocate(self, nbytes: int) -> np.ndarray:
        """A new uint8 array of ``nbytes`` in a new shared window (collective)."""
        self._reclaim()
        window = _Window(self.node, nbytes)
        array, window.array = window.array, None  # the caller's references alone keep it alive
        self.windows.append(window)
        self.version += 1
        return array

    def _reclaim(self) -> None:
        """Free the windows whose arrays every rank has dropped."""
        if not self.windows:
            return
        alive = np.array([w.alive() is not None for w in self.windows], np.uint8)
        self.comm.Allreduce(MPI.IN_PLACE, alive, op=MPI.MAX)
        if alive.all():
            return
        for window, keep in zip(list(self.windows), alive):
            if not keep:
                window.free()
        self.windows = [w for w, keep in zip(self.windows, alive) if keep]
        self.version += 1

    def translate(self, comm: MPI.Comm) -> list[int]:
        """The rank in this registry's node of each rank of ``comm`` (a subset of the node)."""
        return MPI.Group.Translate_ranks(comm.group, list(range(comm.size)), self.node.group)

    def regions(self, ranks: Sequence[int]) -> np.ndarray:
        """For a team whose rank q is node rank ``ranks[q]``: per window, this rank's segment
        size and every team rank's segment address in this process."""
        table = np.zeros((len(self.windows), 1 + len(ranks)), np.int64)
        me = self.node.rank
        for row, window in enumerate(self.windows):
            table[row, 0] = window.sizes[me]
            table[row, 1:] = [window.bases[r] for r in ranks]
        return table

    def free(self) -> None:
        for window in self.windows:
            window.free()
        self.windows.clear()
        self.node.Free()


def registry(ctx: Context) -> Buffers:
    """The registry of shared arrays of a communicator's context (created collectively on first
    use)."""
    return ctx.cached(_KEY, Buffers)


def _shape(shape: Any) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        dims = None
    if dims is None or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                               and d >= 0 for d in dims):
        raise ValueError(f"shape must be a non-negative integer or a tuple of them, "
                         f"got {shape!r}")
    return tuple(int(d) for d in dims)


def empty(shape: int | Sequence[int], dtype: Any = np.float64, comm: MPI.Comm | None = None,
          *, order: str = "C") -> np.ndarray:
    """An uninitialised array in the node's shared memory; collective over ``comm``.

    Like ``numpy.empty``, but every rank of ``comm`` must call it (in the same order as its
    other collectives on ``comm``), and the memory is a segment of an MPI shared window on the
    ranks of ``comm`` that share this rank's node. ``collectives.allreduce(x, out=y,
    algorithm="shm")`` with such arrays reads ``x`` and writes ``y`` in place: no copy in or out.
    Shapes may differ between ranks.

    Parameters
    ----------
    shape
        Integer or tuple of integers.
    dtype
        Any NumPy dtype without Python objects (default float64).
    comm
        Intracommunicator (default ``MPI.COMM_WORLD``).
    order
        "C" or "F".

    Returns
    -------
    numpy.ndarray
        Valid until every reference to it is gone (its window is then freed at a later
        ``empty``/``zeros`` on ``comm``) or ``comm`` is freed.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"comm must be an MPI intracommunicator, got {comm!r}")
    dims = _shape(shape)
    kind = np.dtype(dtype)
    if kind.hasobject or kind.itemsize == 0:
        raise TypeError(f"dtype {kind} cannot live in shared memory (it holds Python objects "
                        f"or has no size)")
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', got {order!r}")
    nbytes = math.prod(dims) * kind.itemsize
    owner = registry(context(comm)).allocate(nbytes)
    return owner.view(kind).reshape(dims, order=order)


def zeros(shape: int | Sequence[int], dtype: Any = np.float64, comm: MPI.Comm | None = None,
          *, order: str = "C") -> np.ndarray:
    """Like :func:`empty`, filled with zeros (collective over ``comm``)."""
    a = empty(shape, dtype, comm, order=order)
    a.fill(0)
    return a
