"""A communicator's private context and a remembered call, for measurements of the library itself.

This entry exists for the experiment scripts of ``bench/`` that time one part of a call apart
from the rest: ``bench/call_overhead.py`` runs an allreduce's algorithm (and its lane) outside
the failure guard, ``bench/timeline_overhead.py`` reaches the guard's observation points with
nothing around them. Both need the object every algorithm takes, the communicator's private
context (:class:`collectives._runtime.context.Context`: its duplicate ``comm``, its failure
guard ``guard``, its caches), and :func:`context` gives it, as a first call on the communicator
makes it. ``bench/repeat_lookup.py`` counts what a repeated call does around its algorithm and
needs the call's remembered entry: :func:`remembered`. Programs never need either: what they
give is internal and changes without notice, and work done on them directly skips the checks
and the guard of the public calls.
"""

from __future__ import annotations

from mpi4py import MPI

from typing import Any

from .._runtime.context import Context
from .._runtime.context import context as _context
from .._runtime.repeats import REPEATS

__all__ = ["context", "remembered"]


def context(comm: MPI.Comm) -> Context:
    """The private context of ``comm`` (made at the first use, collectively over ``comm``, with
    the options of the environment), for measurements only: see the module docstring."""
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(comm).__name__}")
    return _context(comm)


def remembered(x: Any, out: Any, form: str = "allreduce") -> Any:
    """The remembered ``form`` call ("allreduce", "iallreduce") of the arrays ``x`` and ``out``
    in this process's cache of remembered calls (``_runtime/repeats.py``), or None: for
    ``bench/repeat_lookup.py``, which replaces its ``run`` with a function that does nothing to
    time what a repeat does around the algorithm. A call run that way sends nothing: its ranks'
    calls no longer match, so a job that does it ends there."""
    for entry in list(REPEATS.entries.values()):
        if entry.form == form and entry.x() is x and entry.out() is out:
            return entry
    return None
