"""One-sided windows: every rank can put or add its values into another rank's mailbox at any time.

A :class:`Window` is MPI-3 RMA with passive-target synchronisation (``MPI_Win_allocate``,
``MPI_Win_lock``/``unlock``, ``MPI_Put``, ``MPI_Accumulate``, ``MPI_Get``) over a NumPy vector of
each rank: the building block of the asynchronous algorithms of the survey this library follows
(Ben-Nun & Hoefler, section 6: parameter servers, gossip without a global step). BlueFog's
``win_put``/``win_accumulate``/``win_update`` work the same way (Ying et al. 2021).

The memory of rank ``r``'s window holds ``1 + p`` slots of ``n + 1`` elements each:

- slot 0, **own**: rank ``r``'s value as last published by :meth:`Window.update` (or at
  creation), which :meth:`Window.get` of another rank reads;
- slot ``1 + s``, **mailbox of rank s**: what rank ``s`` put or added there since rank ``r``'s
  last :meth:`Window.update`.

The extra element of each slot carries a **push-sum weight** (Kempe et al. 2003; SGP, Assran et
al. 2019): ``put(x, dest, weight=w)`` sends ``w * x`` and ``w``, ``accumulate`` adds them, and
``update(self_weight=a)`` makes ``value = a * value + sum of mailboxes`` and ``weight = a *
weight + sum of mailbox weights``, then empties the mailboxes. Since every value travels with its
weight, ``value / weight`` (:attr:`Window.estimate`) is an average whatever the timing; the sum of
all weights stays what it was when every rank's ``self_weight`` plus the weights it sent is 1.

No call waits for another rank: a put lands in the target's memory while the target computes
(the MPI library progresses it; with MPICH's shared memory a put is a copy into the target's
memory). Only creation and :meth:`Window.free` are collective. What each operation costs: one
lock/unlock pair (a message each way between nodes; an atomic inside one) and ``n + 1`` elements.

Failure semantics (docs/reliability.md): arguments are checked before any access, so a bad call
raises on its rank and touches no other rank's memory; creation checks shape and dtype across
ranks (every rank raises the same error together, nothing allocated); a window used after
:meth:`Window.free` raises ``ValueError``. A rank that never calls :meth:`Window.free` leaves
the others waiting in it, as for any collective (``Options.timeout`` does not cover it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..options import Options
from .one_sided import OneSided

__all__ = ["Window"]

#: dtypes an MPI_Accumulate can add (predefined MPI types)
_DTYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
           np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T}


class Window(OneSided):
    """A one-sided window over a vector of each rank (see the module).

    Parameters
    ----------
    x
        This rank's initial value: a contiguous 1-D NumPy array of float32, float64, int32 or
        int64, of the same size and dtype on every rank (checked across ranks).
    comm
        Intracommunicator (default ``MPI.COMM_WORLD``). Collective: every rank creates it.
    weight
        This rank's initial push-sum weight (default 1).
    options
        As for :func:`collectives.allreduce` (default: from the environment).
    """

    def __init__(self, x: np.ndarray, *, comm: MPI.Comm | None = None,
                 weight: float = 1.0, options: Options | None = None) -> None:
        def check() -> tuple[np.ndarray, dict[str, Any]]:
            if not isinstance(x, np.ndarray) or x.ndim != 1 or not x.flags.c_contiguous:
                raise TypeError("Window: x must be a contiguous 1-D NumPy array, got "
                                f"{type(x).__name__}" + (f" of shape {x.shape}"
                                                         if isinstance(x, np.ndarray) else ""))
            if x.dtype not in _DTYPES:
                raise TypeError(f"Window: dtype {x.dtype} cannot be accumulated by MPI; use "
                                f"one of {', '.join(str(d) for d in _DTYPES)}")
            _check_weight(x.dtype, weight, "weight")
            return x, {"size": x.size, "dtype": str(x.dtype)}

        self._open(comm, options, check)  # every rank raises the same error, together
        self.dtype = x.dtype
        self.size = x.size
        self._mpitype = _DTYPES[x.dtype]
        p = self.comm.size
        self._slot = x.size + 1
        item = x.dtype.itemsize
        self._win = self._window((1 + p) * self._slot * item, item)
        self._mem = np.frombuffer(self._win.tomemory(), dtype=x.dtype).reshape(1 + p, self._slot)
        me = self.comm.rank
        self._win.Lock(me, MPI.LOCK_EXCLUSIVE)
        self._mem[...] = 0
        self._mem[0, :-1] = x
        self._mem[0, -1] = weight
        self._win.Unlock(me)
        self._value = x.copy()
        self._weight = x.dtype.type(weight)
        self._out = np.empty(self._slot, x.dtype)  # the message of a put or accumulate
        self.comm.Barrier()  # every window is ready before anyone writes into it

    # -- what this rank holds ----------------------------------------------------------------------
    @property
    def value(self) -> np.ndarray:
        """This rank's value (a copy)."""
        self._live()
        return self._value.copy()

    @property
    def weight(self) -> float:
        """This rank's push-sum weight."""
        self._live()
        return self._weight.item()

    @property
    def estimate(self) -> np.ndarray:
        """``value / weight``: the push-sum estimate of the average."""
        self._live()
        return self._value / self._weight

    # -- one-sided operations ----------------------------------------------------------------------
    def put(self, x: np.ndarray, dest: int, weight: float = 1.0) -> None:
        """Replace this rank's mailbox at ``dest`` with ``weight * x`` (and its weight)."""
        self._send(x, dest, weight, "put")

    def accumulate(self, x: np.ndarray, dest: int, weight: float = 1.0) -> None:
        """Add ``weight * x`` (and ``weight``) to this rank's mailbox at ``dest``; adds from
        several calls (and threads) sum exactly for integers (``MPI_Accumulate`` is atomic per
        element)."""
        self._send(x, dest, weight, "accumulate")

    def get(self, source: int) -> tuple[np.ndarray, float]:
        """Rank ``source``'s published value and weight (its slot 0)."""
        self._live()
        self._rank(source, "source")
        got = np.empty(self._slot, self.dtype)
        self._win.Lock(source, MPI.LOCK_SHARED)
        try:
            self._win.Get([got, self._mpitype], source, (0, self._slot, self._mpitype))
        finally:
            self._win.Unlock(source)
        return got[:-1], got[-1].item()

    def update(self, self_weight: float = 1.0) -> np.ndarray:
        """Combine what arrived: ``value = self_weight * value + sum of mailboxes`` (the same for
        the weight), empty the mailboxes, publish the result in slot 0; returns a copy of it."""
        self._live()
        _check_weight(self.dtype, self_weight, "self_weight")
        me = self.comm.rank
        self._win.Lock(me, MPI.LOCK_EXCLUSIVE)  # no put or accumulate lands meanwhile
        try:
            self._win.Sync()
            boxes = self._mem[1:]
            total = boxes.sum(axis=0, dtype=self.dtype)
            boxes[...] = 0
            self._value *= self.dtype.type(self_weight)
            self._value += total[:-1]
            self._weight = self.dtype.type(self_weight) * self._weight + total[-1]
            self._mem[0, :-1] = self._value
            self._mem[0, -1] = self._weight
            self._win.Sync()
        finally:
            self._win.Unlock(me)
        return self._value.copy()

    def assign(self, x: np.ndarray, weight: float | None = None) -> None:
        """Replace this rank's value (and its weight, if given) and publish them in slot 0."""
        self._live()
        if not isinstance(x, np.ndarray) or x.shape != (self.size,):
            raise ValueError(f"Window.assign: x must be a NumPy array of shape ({self.size},), "
                             f"got {getattr(x, 'shape', type(x).__name__)}")
        if weight is not None:
            _check_weight(self.dtype, weight, "weight")
        me = self.comm.rank
        self._win.Lock(me, MPI.LOCK_EXCLUSIVE)
        try:
            self._value[...] = x
            if weight is not None:
                self._weight = self.dtype.type(weight)
            self._mem[0, :-1] = self._value
            self._mem[0, -1] = self._weight
            self._win.Sync()
        finally:
            self._win.Unlock(me)

    def _released(self) -> None:
        self._win = self._mem = None

    # -- checks --------------------------------------------------------------------------------------
    def _send(self, x: np.ndarray, dest: int, weight: float, what: str) -> None:
        self._live()
        self._rank(dest, "dest")
        if not isinstance(x, np.ndarray) or x.shape != (self.size,):
            raise ValueError(f"Window.{what}: x must be a NumPy array of shape ({self.size},), "
                             f"got {getattr(x, 'shape', type(x).__name__)}")
        _check_weight(self.dtype, weight, "weight")
        out = self._out
        np.multiply(x, self.dtype.type(weight), out=out[:-1], casting="same_kind")
        out[-1] = weight
        disp = (1 + self.comm.rank) * self._slot
        self._win.Lock(dest, MPI.LOCK_SHARED)
        try:
            if what == "put":
                self._win.Put([out, self._mpitype], dest, (disp, self._slot, self._mpitype))
            else:
                self._win.Accumulate([out, self._mpitype], dest,
                                     (disp, self._slot, self._mpitype), MPI.SUM)
        finally:
            self._win.Unlock(dest)

    def _rank(self, rank: object, what: str) -> None:
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.comm.size:
            raise ValueError(f"Window: {what} must be a rank in 0..{self.comm.size - 1}, "
                             f"got {rank!r}")


def _check_weight(dtype: np.dtype, weight: object, what: str) -> None:
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.number)):
        raise TypeError(f"Window: {what} must be a number, got {weight!r}")
    if dtype.kind == "i" and weight != int(weight):
        raise ValueError(f"Window: {what} of an integer window must be an integer, got {weight}")
    if not np.isfinite(weight):
        raise ValueError(f"Window: {what} must be finite, got {weight}")
