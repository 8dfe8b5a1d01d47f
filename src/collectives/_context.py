"""Per-communicator private state: a duplicate communicator and cached sub-communicators.

Like MPI libraries do internally, every collective talks on a private duplicate of the caller's
communicator, so its point-to-point messages can never match the caller's own. The duplicate and
anything derived from it (the node communicators of "hierarchical") hang off the caller's
communicator as an MPI attribute, so they are created once, collectively, on first use, and are
freed when the caller frees that communicator.
"""

from __future__ import annotations

from typing import Any, Callable

from mpi4py import MPI

from ._guard import Guard

__all__ = ["Context", "context", "reset"]


class Context:
    """Private duplicate of a communicator plus a cache of derived objects."""

    def __init__(self, comm: MPI.Comm, dup: bool = True) -> None:
        self.comm: MPI.Comm = comm.Dup() if dup else comm
        if dup:  # a size mismatch must raise (MPI_ERR_TRUNCATE), not end the job
            self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        #: where MPI's own collectives run under a guard: not on ``comm``, whose other
        #: collectives (validate's allgather, node splits) must never meet one a failure left
        self.native_comm: MPI.Comm = self.comm.Dup() if dup else comm
        self._owned = dup
        self._cache: dict[Any, Any] = {}
        self._guard: Guard | None = None

    @property
    def guard(self) -> Guard:
        """The communicator's :class:`~._guard.Guard` (made at the first call, collectively)."""
        if self._guard is None:
            self._guard = Guard(self.comm)
        return self._guard

    def cached(self, key: Any, make: Callable[[MPI.Comm], Any]) -> Any:
        """``make(self.comm)`` on first use of ``key`` (collectively on all ranks), then cached."""
        if key not in self._cache:
            self._cache[key] = make(self.comm)
        return self._cache[key]

    def free(self) -> None:
        """Free what this context created (cached values free themselves via ``free()``)."""
        for value in self._cache.values():
            if hasattr(value, "free"):
                value.free()
        self._cache.clear()
        if self._guard is not None:
            self._guard.close()
        if self._owned:
            self.native_comm.Free()
            self.comm.Free()


def _delete(comm: MPI.Comm, keyval: int, ctx: Context) -> None:
    try:
        ctx.free()
    except MPI.Exception:  # pragma: no cover - MPI already finalizing
        pass


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)


def context(comm: MPI.Comm) -> Context:
    """The :class:`Context` of ``comm``; the first call on a communicator is collective."""
    ctx = comm.Get_attr(_KEYVAL)
    if ctx is None:
        ctx = Context(comm)
        comm.Set_attr(_KEYVAL, ctx)
    return ctx


def reset(comm: MPI.Comm) -> None:
    """Drop the library's private state of ``comm`` (collective: every rank calls it, between
    the same two calls): its duplicate is freed and the next call makes a fresh one. After a
    failure this brings the MPI library's own collectives ("native") back, which a failure
    retires on the communicator (``_guard.py``); it also frees cached sub-communicators."""
    if comm.Get_attr(_KEYVAL) is not None:
        comm.Delete_attr(_KEYVAL)
