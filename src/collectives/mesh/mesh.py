"""A process mesh: a communicator cut into an n-D grid of ranks with named axes.

``Mesh((2, 2, 2), names=("dp", "pp", "tp"))`` is what ``torch.distributed.DeviceMesh``
(``init_device_mesh(..., mesh_dim_names=("dp", "tp"))``, ``mesh.get_group("tp")``) gives, on MPI
communicators: ``mesh.comm("tp")`` is the communicator of the ranks that differ from this one
only along ``tp``, and any layer above (the collectives' ``comm=``, a pipeline's sends) takes it.
It holds no algorithm: it splits, names the axes and hands out the communicators.

**Positions.** The ranks of ``comm`` are laid out on the grid in row-major order (the last axis
varies fastest), after ordering them by node (``_runtime/nodes.py``: the shared-memory node,
or the emulated node of ``Options.node_size``), then by rank. So the ranks of one node fill
consecutive positions, which are the innermost axes where a node's ranks fit in them (the
tensor-parallel axis, placed last, stays on a node). With the usual block placement
(``mpiexec`` fills one node, then the next) this order is the ranks' own.

**Communicators.** For a set of axes, the ranks that share their coordinates on every other
axis form one communicator, ordered row-major by their coordinates along the set's axes (taken
in the mesh's order, whatever order they are named in); ``comm()`` (every axis) is the whole
mesh in mesh order. All of them, one per non-empty set of axes (``2**n - 1``: 7 for three
axes), are made *eagerly* by the constructor (``Comm.Split``, collective), so that asking for
one later is local and no rank can wait for another that never asks. ``free()`` (or leaving a
``with`` block) frees them, collectively; the library's private state on them goes with them.

**Checks.** Shape and names are checked on every rank (positive integer sizes whose product is
the communicator's size, unique string names, one per axis) and the ranks' arguments compared
(``_runtime/blocking.construct``): every rank raises the same error, before any communicator
is made.

``neighbors(axis)`` gives the previous and next rank along ``axis``, as ranks of
``comm(axis)`` (the coordinate along the axis), the communicator their messages travel on:
``None`` at the edges (a pipeline's first and last stage), or wrapped around with
``periodic=True`` (a ring).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .._runtime.blocking import construct
from .._runtime.nodes import node_ids
from ..options import Options

__all__ = ["Mesh"]


class Mesh:
    """An n-D grid of the ranks of ``comm`` (default ``COMM_WORLD``) with named axes (module
    docstring). Collective to make and to :meth:`free`.

    Parameters
    ----------
    shape
        The size of each axis; their product is ``comm.size``.
    names
        One unique name per axis.
    comm
        The communicator to cut (it is not freed with the mesh).
    options
        ``Options.node_size`` (emulated nodes) and ``Options.timeout`` (of the checks).
    """

    def __init__(self, shape: Sequence[int], names: Sequence[str] = ("dp", "pp", "tp"),
                 comm: MPI.Comm | None = None, options: Options | None = None) -> None:
        comm = MPI.COMM_WORLD if comm is None else comm

        def check() -> tuple[tuple[tuple[int, ...], tuple[str, ...]], dict[str, Any]]:
            checked = _checked(shape, names, comm.size)
            return checked, {"shape": checked[0], "names": checked[1]}

        _, opts = construct("Mesh", comm, options, check)  # the same error on every rank
        self.shape, self.names = _checked(shape, names, comm.size)  # passed everywhere: no error
        self.parent = comm
        nodes = node_ids(comm, opts.node_size)
        #: the rank of ``comm`` at each position of the grid (row-major), and the inverse
        self.order: tuple[int, ...] = tuple(sorted(range(comm.size), key=lambda r: (nodes[r], r)))
        self._position = {rank: i for i, rank in enumerate(self.order)}
        self.rank = comm.rank
        self._freed = False
        self._comms: dict[tuple[int, ...], MPI.Comm] = {}
        me = self.coords()
        for k in range(1, len(self.shape) + 1):
            for axes in combinations(range(len(self.shape)), k):
                others = [i for i in range(len(self.shape)) if i not in axes]
                color = _ravel([me[i] for i in others], [self.shape[i] for i in others])
                key = _ravel([me[i] for i in axes], [self.shape[i] for i in axes])
                self._comms[axes] = comm.Split(color, key)

    # -- the grid ----------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    def size(self, axis: str | int | None = None) -> int:
        """The number of ranks along ``axis`` (None: in the whole mesh)."""
        if axis is None:
            return len(self.order)
        return self.shape[self._axis(axis)]

    def coords(self, rank: int | None = None) -> tuple[int, ...]:
        """The coordinates of ``rank`` of the mesh's communicator (default: this rank)."""
        rank = self.rank if rank is None else rank
        if rank not in self._position:
            raise ValueError(f"Mesh.coords: rank must be a rank of the communicator (0 to "
                             f"{len(self.order) - 1}), got {rank!r}")
        return _unravel(self._position[rank], self.shape)

    def rank_of(self, coords: Sequence[int]) -> int:
        """The rank of the mesh's communicator at ``coords``."""
        coords = tuple(coords)
        if len(coords) != self.ndim or not all(
                isinstance(c, (int, np.integer)) and not isinstance(c, bool) and 0 <= c < n
                for c, n in zip(coords, self.shape)):
            raise ValueError(f"Mesh.rank_of: coords must be {self.ndim} ints within the shape "
                             f"{self.shape}, got {coords!r}")
        return self.order[_ravel([int(c) for c in coords], self.shape)]

    def comm(self, axes: str | int | Sequence[str | int] | None = None) -> MPI.Comm:
        """The communicator of ``axes`` (a name, an index or several; None: every axis): the
        ranks that differ from this one only along them, ordered by their coordinates."""
        if axes is None:
            key = tuple(range(self.ndim))
        elif isinstance(axes, (str, int)):
            key = (self._axis(axes),)
        else:
            key = tuple(sorted({self._axis(a) for a in axes}))
            if not key:
                raise ValueError("Mesh.comm: name at least one axis")
        self._live()
        return self._comms[key]

    def neighbors(self, axis: str | int, periodic: bool = False
                  ) -> tuple[int | None, int | None]:
        """``(previous, next)`` along ``axis``, as ranks of ``comm(axis)``: None past an edge,
        unless ``periodic`` (wrapped around)."""
        i = self._axis(axis)
        n, c = self.shape[i], self.coords()[i]
        if periodic:
            return (c - 1) % n, (c + 1) % n
        return (c - 1 if c > 0 else None), (c + 1 if c < n - 1 else None)

    def _axis(self, axis: str | int) -> int:
        if isinstance(axis, str) and axis in self.names:
            return self.names.index(axis)
        if isinstance(axis, int) and not isinstance(axis, bool) and 0 <= axis < self.ndim:
            return axis
        raise ValueError(f"Mesh: unknown axis {axis!r}; the axes are {', '.join(self.names)} "
                         f"(or 0 to {self.ndim - 1})")

    # -- lifetime ----------------------------------------------------------------------------
    def free(self) -> None:
        """Free every communicator the mesh made (collective); a second call does nothing."""
        comms, self._comms = self._comms, {}
        for c in comms.values():
            if c != MPI.COMM_NULL and not MPI.Is_finalized():
                c.Free()
        self._freed = True

    def _live(self) -> None:
        if self._freed:
            raise ValueError("Mesh: the mesh has been freed")

    def __enter__(self) -> "Mesh":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.names, self.shape))
        return f"Mesh({axes}; rank {self.rank} at {self.coords()})"


def _checked(shape: object, names: object, size: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``shape`` and ``names`` as tuples, or the error every rank raises (module docstring)."""
    if isinstance(shape, int) or not isinstance(shape, Sequence) or isinstance(shape, str):
        raise TypeError(f"Mesh: shape must be a sequence of ints, got {shape!r}")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        raise TypeError(f"Mesh: shape must hold ints, got {tuple(shape)!r}")
    shape = tuple(int(n) for n in shape)
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"Mesh: every axis needs a positive size, got shape {shape}")
    if isinstance(names, str) or not isinstance(names, Sequence) or \
            not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"Mesh: names must be a sequence of non-empty strings, got {names!r}")
    names = tuple(names)
    if len(names) != len(shape):
        raise ValueError(f"Mesh: {len(names)} names {names} for {len(shape)} axes {shape}; "
                         "name every axis, once")
    if len(set(names)) != len(names):
        raise ValueError(f"Mesh: the names must differ, got {names}")
    total = 1
    for n in shape:
        total *= n
    if total != size:
        raise ValueError(f"Mesh: shape {shape} holds {total} ranks, the communicator has {size}")
    return shape, names


def _ravel(coords: Sequence[int], shape: Sequence[int]) -> int:
    """The row-major index of ``coords`` in ``shape`` (the last axis fastest)."""
    index = 0
    for c, n in zip(coords, shape):
        index = index * n + c
    return index


def _unravel(index: int, shape: Sequence[int]) -> tuple[int, ...]:
    coords = []
    for n in reversed(shape):
        index, c = divmod(index, n)
        coords.append(c)
    return tuple(reversed(coords))
