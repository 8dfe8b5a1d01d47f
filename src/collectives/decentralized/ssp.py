"""A stale-synchronous parameter server over one-sided windows (Ho et al. 2013, "More effective
distributed ML via a stale synchronous parallel parameter server"; Ben-Nun & Hoefler, section 6.1).

The parameters are sharded over the ranks: rank ``r`` serves block ``r`` of the vector (the
blocks of ``np.array_split``) in an MPI window of its own memory. Every rank is also a worker.
A step of worker ``i`` at its step ``t`` is

1. **wait** until every worker has pushed at least ``t - s`` steps (``s``: the staleness bound),
   reading the ranks' push clocks, which live in a window on rank 0;
2. **pull**: read every shard (``MPI_Get`` under a shared lock of each server);
3. compute its gradient on what it pulled;
4. **push**: add ``-lr * gradient`` to every shard (``MPI_Accumulate``, atomic per element, so
   pushes of several workers never lose an update), then advance its push clock to ``t + 1``.

So no worker runs more than ``s`` steps ahead of the slowest, and what a worker reads at step
``t`` holds every update of every step before ``t - s`` (and maybe some later ones). ``s = 0``
adds one wait: a worker pushes step ``t`` only once every worker has pulled step ``t`` (a second
clock, of pulls), which makes every pull of step ``t`` read exactly the parameters after all
pushes of steps before ``t``: synchronous SGD with the gradients summed (``lr`` times the sum).
``s = None`` waits for nothing (asynchronous, Hogwild-style: Recht et al. 2011).

Cost per step and worker: ``p`` gets and ``p`` accumulates of about ``n / p`` elements each (the
whole vector in and out, as a parameter server's worker), plus one small get of the clocks per
poll while it waits, and one put of its clock.

Non-blocking for the others: a server takes part in nothing (passive target); a worker waits
only for the staleness bound, ``Options.timeout`` seconds at most (the ``options=`` given),
then raises ``TimeoutError`` naming the slowest worker.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from .._runtime.ranks import partition
from ..options import Options
from .one_sided import OneSided

__all__ = ["ParameterServer"]

_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE}
#: seconds between two reads of the clocks while a worker waits
POLL_S = 1e-4


class ParameterServer(OneSided):
    """Sharded parameters with bounded staleness ``staleness`` (see the module).

    Parameters
    ----------
    x
        The initial parameters: a contiguous 1-D float32 or float64 NumPy array, the same size and
        dtype on every rank (rank 0's values are used). Collective.
    staleness
        ``s >= 0`` steps, or None for no bound (asynchronous).
    lr
        The step size a push multiplies its gradient by.
    comm
        Intracommunicator (default ``MPI.COMM_WORLD``).
    options
        As for :func:`collectives.allreduce` (default: from the environment); its ``timeout``
        is how many seconds a worker waits for the staleness bound before ``TimeoutError``
        (None waits for ever).
    """

    #: no worker still reads or writes when the windows go
    BARRIER_ON_FREE = True

    def __init__(self, x: np.ndarray, *, staleness: int | None, lr: float,
                 comm: MPI.Comm | None = None, options: Options | None = None) -> None:

        def check() -> tuple[None, dict[str, Any]]:
            if not isinstance(x, np.ndarray) or x.ndim != 1 or x.dtype not in _TYPES:
                raise TypeError("ParameterServer: x must be a 1-D float32 or float64 NumPy "
                                f"array, got {getattr(x, 'dtype', type(x).__name__)}"
                                f"{'' if not isinstance(x, np.ndarray) else f' {x.shape}'}")
            if staleness is not None and (isinstance(staleness, bool) or not
                                          isinstance(staleness, int) or staleness < 0):
                raise ValueError(f"ParameterServer: staleness must be an integer >= 0 or None, "
                                 f"got {staleness!r}")
            if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not np.isfinite(lr):
                raise ValueError(f"ParameterServer: lr must be a finite number, got {lr!r}")
            return None, {"size": x.size, "dtype": str(x.dtype), "staleness": staleness,
                          "lr": lr}

        self._open(comm, options, check)  # every rank raises the same error, together
        self.staleness, self.lr = staleness, lr
        self.timeout = self.options.timeout
        self.dtype, self.size = x.dtype, x.size
        p, me = self.comm.size, self.comm.rank
        self._type = _TYPES[x.dtype]
        offsets = partition(x.size, p)
        self._blocks = list(zip(offsets[:-1], offsets[1:]))
        lo, hi = self._blocks[me]
        item = x.dtype.itemsize
        self._params = self._window(max(hi - lo, 1) * item, item)
        first = x.copy()
        self.comm.Bcast([first, self._type], root=0)  # rank 0's values everywhere
        mine = np.frombuffer(self._params.tomemory(), dtype=x.dtype)[: hi - lo]
        self._params.Lock(me, MPI.LOCK_EXCLUSIVE)
        mine[...] = first[lo:hi]
        self._params.Unlock(me)
        # clocks on rank 0: pushes[p], pulls[p] (int64)
        self._clocks = self._window(2 * p * 8 if me == 0 else 0, 8)
        if me == 0:
            self._clocks.Lock(0, MPI.LOCK_EXCLUSIVE)
            np.frombuffer(self._clocks.tomemory(), dtype=np.int64)[...] = 0
            self._clocks.Unlock(0)
        self.step = 0            # this worker's next step
        self.waited = 0.0        # seconds spent waiting for the staleness bound
        self.slowest = 0         # the slowest worker's pushed steps seen at the last pull
        self._pulled = np.empty(x.size, x.dtype)
        self._delta = np.empty(x.size, x.dtype)
        self._tick = np.empty(1, np.int64)
        self.comm.Barrier()  # every window ready before anyone reads or writes

    # -- a step ------------------------------------------------------------------------------------
    def pull(self) -> np.ndarray:
        """Wait for the staleness bound, then read the parameters (a new array)."""
        self._live()
        t, s = self.step, self.staleness
        if s is not None:
            self.slowest = self._wait(0, t - s, "push")
        pulled = self.read()
        if s == 0:
            self._set_clock(1, t + 1)  # pulled step t
        return pulled

    def read(self) -> np.ndarray:
        """The parameters as they are now (a new array; no wait, no clock: a checkpoint's)."""
        self._live()
        for r, (lo, hi) in enumerate(self._blocks):
            if hi > lo:
                self._params.Lock(r, MPI.LOCK_SHARED)
                self._params.Get([self._pulled[lo:hi], self._type], r, (0, hi - lo, self._type))
                self._params.Unlock(r)
        return self._pulled.copy()

    def push(self, gradient: np.ndarray) -> None:
        """Add ``-lr * gradient`` to the parameters and finish this worker's step."""
        self._live()
        if not isinstance(gradient, np.ndarray) or gradient.shape != (self.size,):
            raise ValueError(f"ParameterServer.push: gradient must be a NumPy array of shape "
                             f"({self.size},), got {getattr(gradient, 'shape', type(gradient))}")
        t = self.step
        if self.staleness == 0:  # nobody changes step t's parameters before all have read them
            self._wait(1, t + 1, "pull")
        np.multiply(gradient, -self.lr, out=self._delta, casting="same_kind")
        for r, (lo, hi) in enumerate(self._blocks):
            if hi > lo:
                self._params.Lock(r, MPI.LOCK_SHARED)
                self._params.Accumulate([self._delta[lo:hi], self._type], r,
                                        (0, hi - lo, self._type), MPI.SUM)
                self._params.Unlock(r)
        self.step = t + 1
        self._set_clock(0, t + 1)

    def reset(self, x: np.ndarray, step: int) -> None:
        """Collective: make rank 0's ``x`` the parameters and ``step`` every worker's clocks and
        next step (resuming from a checkpoint)."""
        self._live()
        if not isinstance(x, np.ndarray) or x.shape != (self.size,):
            raise ValueError(f"ParameterServer.reset: x must be a NumPy array of shape "
                             f"({self.size},), got {getattr(x, 'shape', type(x).__name__)}")
        self.comm.Barrier()  # nobody still reads or writes the old state
        first = x.astype(self.dtype)
        self.comm.Bcast([first, self._type], root=0)
        me = self.comm.rank
        lo, hi = self._blocks[me]
        self._params.Lock(me, MPI.LOCK_EXCLUSIVE)
        np.frombuffer(self._params.tomemory(), dtype=self.dtype)[: hi - lo] = first[lo:hi]
        self._params.Unlock(me)
        self.step = step
        self._set_clock(0, step)
        self._set_clock(1, step)
        self.comm.Barrier()

    def clocks(self) -> np.ndarray:
        """Every worker's pushed steps (read from rank 0)."""
        self._live()
        return self._read(0).copy()

    def _released(self) -> None:
        self._params = self._clocks = None

    # -- clocks -----------------------------------------------------------------------------------
    def _read(self, which: int) -> np.ndarray:
        p = self.comm.size
        got = np.empty(p, np.int64)
        self._clocks.Lock(0, MPI.LOCK_SHARED)
        self._clocks.Get([got, MPI.INT64_T], 0, (which * p, p, MPI.INT64_T))
        self._clocks.Unlock(0)
        return got

    def _set_clock(self, which: int, value: int) -> None:
        self._tick[0] = value
        self._clocks.Lock(0, MPI.LOCK_SHARED)
        self._clocks.Put([self._tick, MPI.INT64_T], 0,
                         (which * self.comm.size + self.comm.rank, 1, MPI.INT64_T))
        self._clocks.Unlock(0)

    def _wait(self, which: int, least: int, what: str) -> int:
        """Poll clock ``which`` until every worker's is at least ``least``; its minimum."""
        start = time.monotonic()
        while True:
            clocks = self._read(which)
            low = int(clocks.min())
            if low >= least:
                self.waited += time.monotonic() - start
                return low
            if self.timeout is not None and time.monotonic() - start > self.timeout:
                slow = int(clocks.argmin())
                raise TimeoutError(f"ParameterServer: rank {self.comm.rank} waited {self.timeout:g}"
                                   f" s for step {least} of every worker to {what}; rank {slow} "
                                   f"is at {low}")
            time.sleep(POLL_S)
