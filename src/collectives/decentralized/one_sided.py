"""What the decentralized objects that hold one-sided windows share: opening, freeing, use after free.

``Window``, ``ParameterServer`` and ``PairwiseAveraging`` each allocate MPI windows on a private
duplicate of the caller's communicator and keep them across calls. :class:`OneSided` gives them
one constructor path (:func:`collectives._runtime.blocking.construct`: ``options=`` resolved
once, the arguments checked across ranks so that every rank raises the same error together),
one ``free()`` (collective; the windows freed, the RMA progress of the communicator released;
a second ``free()`` does nothing), the context-manager protocol, and the check that raises
``ValueError`` on any use after ``free()``.

An object never freed is freed with the communicator's private context: when the caller frees
the communicator, at ``collectives.reset``, and before MPI finalizes (at exit or an explicit
``MPI.Finalize()``: ``_runtime/context.py``). It waits in the context's cache of derived
objects, which frees its values first; every rank made the objects in the same order, so every
rank frees them in the same order. A window left open into ``MPI_Finalize`` made MPICH over
UCX print warnings at exit ("destroying inuse region").
"""

from __future__ import annotations

from typing import Any, Callable

from mpi4py import MPI

from .._runtime import rma_progress
from .._runtime.blocking import construct
from ..options import Options

__all__ = ["OneSided"]


class OneSided:
    """Base of the classes that hold one-sided windows (see the module)."""

    #: whether ``free()`` waits for every rank first (no rank still reads or writes a window
    #: through a passive-target epoch of its own)
    BARRIER_ON_FREE = False

    comm: MPI.Comm
    options: Options

    def _open(self, comm: MPI.Comm | None, options: Options | None,
              check: Callable[[], tuple[Any, dict[str, Any]]]) -> None:
        """The collective first step of a constructor: checks agreed across ranks, then the
        private communicator, whose RMA operations progress while this rank computes."""
        ctx, self.options = construct(type(self).__name__, comm, options, check)
        self.comm = ctx.comm
        self._windows: list[MPI.Win] | None = []
        rma_progress.hold(self.comm)
        # freed with the context if not before (the module docstring)
        self._ctx = ctx
        ctx.cache[(OneSided, id(self))] = self

    def _window(self, nbytes: int, unit: int) -> MPI.Win:
        """A new window of ``nbytes`` on this rank (collective), freed by :meth:`free`."""
        win = MPI.Win.Allocate(nbytes, unit, comm=self.comm)
        self._windows.append(win)
        return win

    def _released(self) -> None:
        """Drop what refers to the windows' memory (their views); called by :meth:`free`."""

    def free(self) -> None:
        """Release the windows (collective); later use raises ``ValueError``."""
        windows = self._windows
        if windows is None:
            return
        if self._ctx.live:  # (the context's own free is iterating its cache otherwise)
            self._ctx.cache.pop((OneSided, id(self)), None)
        if self.BARRIER_ON_FREE:
            self.comm.Barrier()
        self._windows = None
        self._released()
        for win in windows:
            win.Free()
        rma_progress.release(self.comm)

    def __enter__(self) -> "OneSided":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()

    def _live(self) -> None:
        if self._windows is None:
            raise ValueError(f"{type(self).__name__}: used after free()")
