"""Per-communicator private state: a duplicate communicator and cached sub-communicators.

Like MPI libraries do internally, every collective talks on a private duplicate of the caller's
communicator, so its point-to-point messages can never match the caller's own. The duplicate and
anything derived from it (the node communicators of "hierarchical") hang off the caller's
communicator as an MPI attribute (the library's one, :mod:`.slots`), so they are created once,
collectively, on first use, and are freed when the caller frees that communicator.

Communicators never freed (``COMM_WORLD`` above all) would keep their contexts, shared windows
included, open into ``MPI_Finalize``: MPICH over OFI then fails to close its fabric ("OFI call
fabricclose failed: Device or resource busy"). So every context still held is freed, newest
first, before MPI finalizes: at interpreter exit (``atexit``: mpi4py finalizes MPI after it, too
late to run Python callbacks) and, for an explicit ``MPI.Finalize()``, from the deletion of
``MPI_COMM_SELF``'s attributes, which MPI does first (:func:`.slots.at_finalize`: after the
engines' hook). Every rank made its contexts in the same order
(collectively), so every rank frees them in the same order.
"""

from __future__ import annotations

import atexit
import time
from typing import Any, Callable

from mpi4py import MPI

from ..options import Options
from . import release as _release
from . import comm_state as _slots
from .guard import Guard

__all__ = ["Context", "context", "reset"]


class Context:
    """Private duplicate of a communicator plus a cache of derived objects."""

    def __init__(self, comm: MPI.Comm, dup: bool = True, timeout: float | None = None,
                 control: MPI.Comm | None = None) -> None:
        _release.progress()  # free the released communicators that can be freed by now
        self.comm: MPI.Comm = _duplicate(comm, timeout) if dup else comm
        if dup:  # a size mismatch must raise (MPI_ERR_TRUNCATE), not end the job
            self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        #: where MPI's own collectives run under a guard: not on ``comm``, whose other
        #: collectives (validate's allgather, node splits) must never meet one a failure left
        self.native_comm: MPI.Comm = self.comm.Dup() if dup else comm
        #: where the ranks agree on a native operation's signature before it runs
        #: (:mod:`.agree`): nothing else runs there, so a check left behind by a failure can
        #: never pair with another collective; without a duplicate of our own, the one the
        #: maker gives and frees (``control``: the progress engine's, hierarchical's cross-node
        #: contexts'), else None (no check: the engine's named stream)
        self.control_comm: MPI.Comm | None = self.comm.Dup() if dup else control
        #: the signature of a native operation that every rank agreed on last (:mod:`.agree`)
        self.agreed: tuple | None = None
        #: operations this rank started under a guard on ``native_comm`` (MPI's own collectives)
        #: and ``control_comm`` (signature checks): a release compares them across ranks, and
        #: parks a duplicate whose counts differ instead of freeing it (``_runtime/release.py``)
        self.started = [0, 0]
        self._owned = dup
        #: the guard of the public call now running on this context (:meth:`Guard.run` sets
        #: it), None outside one: the algorithms hand it to every message they send
        self.active: Guard | None = None
        #: objects derived from the communicator, by key (:meth:`cached` fills it)
        self.cache: dict[Any, Any] = {}
        self._guard: Guard | None = None
        #: False once freed (the communicator freed, or :func:`reset`): whoever kept this
        #: context (a remembered call, a plan) must look the communicator's current one up
        self.live = True

    @property
    def guard(self) -> Guard:
        """The communicator's :class:`~.guard.Guard` (made at the first call, collectively)."""
        if self._guard is None:
            self._guard = Guard(self.comm, self)
        return self._guard

    def cached(self, key: Any, make: Callable[[MPI.Comm], Any]) -> Any:
        """``make(self.comm)`` on first use of ``key`` (collectively on all ranks), then cached."""
        if key not in self.cache:
            self.cache[key] = make(self.comm)
        return self.cache[key]

    def free(self) -> None:
        """Free what this context created (cached values free themselves via ``free()``)."""
        self.live = False
        for value in self.cache.values():
            if hasattr(value, "free"):
                value.free()
        self.cache.clear()
        if self._guard is not None:
            self._guard.close()
            _release.keep(self._guard.dangling)  # abandoned operations MPI may still complete
        if self._owned:  # the duplicates of MPI's own collectives go with the release
            _release.release(self.comm, self._guard, self.native_comm, self.control_comm,
                             (self.started[0], self.started[1]))


#: the communicators holding a context (in their slots), in the order the contexts were made
_HELD: dict[Context, MPI.Comm] = {}


def _free(comm: MPI.Comm, ctx: Context) -> None:
    _HELD.pop(ctx, None)
    try:
        ctx.free()
    except MPI.Exception:  # pragma: no cover - MPI already finalizing
        pass


_slots.register("context", _free)


def _duplicate(comm: MPI.Comm, timeout: float | None) -> MPI.Comm:
    """``comm.Dup()``, collective; with a ``timeout``, TimeoutError once it has waited that long
    for the other ranks (``MPI_Comm_idup``, tested)."""
    if timeout is None:
        return comm.Dup()
    new, request = comm.Idup()
    deadline = time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the first collective call on this communicator timed out after {timeout:g} s "
                "(Options.timeout): a rank has not made it (every rank's first call on a "
                "communicator sets up its private duplicate, together)")
        time.sleep(_NAP_S)
    return new


#: Seconds between the tests of a first call's duplication under a timeout.
_NAP_S = 1e-4


def context(comm: MPI.Comm, options: Options | None = None) -> Context:
    """The :class:`Context` of ``comm``; the first call on a communicator is collective, and
    waits at most ``Options.timeout`` for the other ranks (``options``, default: from the
    environment)."""
    ctx = _slots.get(comm, "context")
    if ctx is None:
        opts = Options.from_env() if options is None else options
        ctx = Context(comm, timeout=opts.timeout)
        _slots.put(comm, "context", ctx)
        _HELD[ctx] = comm
    return ctx


def reset(comm: MPI.Comm) -> None:
    """Drop the library's private state of ``comm`` (collective: every rank calls it, between
    the same two calls): its duplicate is freed and the next call makes a fresh one. After a
    failure this brings the MPI library's own collectives ("native") back, which a failure
    retires on the communicator (``_runtime/guard.py``); it also frees cached sub-communicators."""
    _slots.drop(comm, "context")


def _free_all(finalizing: bool = False) -> None:
    """Free every context still held, newest first (see the module docstring); ``COMM_SELF``'s
    are left to MPI when ``finalizing`` (inside ``MPI_Finalize``, which is already deleting that
    communicator's attributes)."""
    _release.mark_exiting()
    for ctx, comm in reversed(list(_HELD.items())):
        if MPI.Is_finalized():
            return
        if finalizing and comm == MPI.COMM_SELF:
            continue
        try:
            _slots.drop(comm, "context")  # runs _free
        except MPI.Exception:  # pragma: no cover - the handle was freed behind our back
            _HELD.pop(ctx, None)
    if not MPI.Is_finalized():
        _release.finish()


atexit.register(_free_all)
_slots.at_finalize("context", lambda: _free_all(True))
