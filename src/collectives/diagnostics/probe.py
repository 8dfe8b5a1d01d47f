"""A communicator's private context, for measurements of the library itself.

This entry exists for the experiment scripts of ``bench/`` that time one part of a call apart
from the rest: ``bench/call_overhead.py`` runs an allreduce's algorithm (and its lane) outside
the failure guard, ``bench/timeline_overhead.py`` reaches the guard's observation points with
nothing around them. Both need the object every algorithm takes, the communicator's private
context (:class:`collectives._runtime.context.Context`: its duplicate ``comm``, its failure
guard ``guard``, its caches), and :func:`context` gives it, as a first call on the communicator
makes it. Programs never need it: what the context holds is internal and changes without notice,
and work done on it directly skips the checks and the guard of the public calls.
"""

from __future__ import annotations

from mpi4py import MPI

from .._runtime.context import Context
from .._runtime.context import context as _context

__all__ = ["context"]


def context(comm: MPI.Comm) -> Context:
    """The private context of ``comm`` (made at the first use, collectively over ``comm``, with
    the options of the environment), for measurements only: see the module docstring."""
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(comm).__name__}")
    return _context(comm)
