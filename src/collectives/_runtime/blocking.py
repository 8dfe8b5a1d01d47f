"""The one path of a blocking public call: options once, the guard once, check, run.

Every blocking collective (``api.py``'s allreduce family, ``compressed_allreduce``, the neighbor
collectives) is a *call* class: its constructor checks the arguments and fixes what a run needs,
``run(ctx)`` communicates. :func:`run_call` runs one:

1. the options are resolved once (:func:`.validate.resolve`: ``None`` reads the environment) and
   type-checked; options of the wrong type are not raised yet: the environment's stand in for
   the guard's timeout and failure mode, and the ``TypeError`` is raised inside the guard, as
   every other bad argument is;
2. a timeline that the options ask for starts (``Options.timeline``), before the guard, so that
   the call is its first span;
3. the call runs under the runner of the options' failure mode (:func:`.abort_mode.runner`: the
   communicator's guard, or abort mode's runner): the arguments are checked there (with
   ``validate``, across ranks too), then the call runs, so that an error on any rank becomes an
   error on every rank that still needs it, and the ranks number their calls alike whether they
   fail or not. What the checks raise is marked as an argument error
   (:func:`.guard.mark_argument_error`: found before any message, so the crash hook prints it
   without a flight-recorder dump).

With one rank there is nobody to wait for: the call is checked and run in place, without a
context. The objects that hold MPI resources across calls (the decentralized classes) are built
by :func:`construct`: options the same way, their checks agreed across ranks. The non-blocking
forms hand the same call classes to the progress engine (:mod:`collectives.engine.nonblocking`).

Point-to-point calls (``collectives.send`` and the others, ``pt2pt/messages.py``) are not
collective: :func:`run_local` runs them with the options resolved the same way and their checks
marked the same way, but outside the guard (whose call numbers count collective calls) and
without a context (whose making is collective); the call waits under ``Options.timeout`` itself.
"""

from __future__ import annotations

from typing import Any, Callable

from mpi4py import MPI

from ..options import Options
from .context import Context, context
from .abort_mode import runner
from .guard import mark_argument_error
from .validate import check_comm, checked, checked_call, resolve, timeline_option

__all__ = ["construct", "prepare_local", "run_call", "run_local"]


def run_call(cls: type, comm: MPI.Comm | None, options: Any, validate: bool | None,
             *args: Any) -> Any:
    """Check and run ``cls(comm, *args, opts)`` as one blocking call on ``comm`` (default
    ``COMM_WORLD``); returns the call (its ``result`` is the caller's)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    check_comm(cls.kind, comm)
    opts, problem = resolve(options)
    timeline_option(opts, comm)
    if comm.size == 1:
        return _checked_run(cls, comm, opts, problem, validate, None, None, args)
    ctx = context(comm, opts)
    by = runner(ctx, opts)
    return by.run(cls.kind, _checked_run, cls, comm, opts, problem, validate, ctx, by, args)


def _checked_run(cls: type, comm: MPI.Comm, opts: Options, problem: TypeError | None,
                 validate: bool | None, ctx: Context, by: Any, args: tuple) -> Any:
    """The body :func:`run_call` runs under ``by`` (None with one rank)."""
    if by is not None:
        by.set_timeout(opts.timeout)
    try:
        if problem is not None:
            raise problem
        call = checked_call(cls, comm, opts.validate if validate is None else bool(validate),
                            *args, opts)
    except Exception as exc:
        mark_argument_error(exc)
        raise
    if by is not None:
        by.call = call
    call.run(None if call.trivial else ctx)
    return call


def run_local(cls: type, comm: MPI.Comm | None, options: Any, *args: Any) -> Any:
    """Check and run ``cls(comm, *args, opts)`` on this rank alone (a point-to-point call: the
    module docstring): ``run(comm)`` gets the caller's communicator. Returns the call."""
    call, comm = prepare_local(cls, comm, options, *args)
    call.run(comm)
    return call


def prepare_local(cls: type, comm: MPI.Comm | None, options: Any,
                  *args: Any) -> tuple[Any, MPI.Comm]:
    """:func:`run_local`'s checks alone: ``(call, comm)``, for a persistent form that runs the
    call again and again (``send_init``)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    try:
        check_comm(cls.kind, comm)
        opts, problem = resolve(options)
        if problem is not None:
            raise problem
        return cls(comm, *args, opts), comm
    except Exception as exc:
        mark_argument_error(exc)
        raise


def construct(name: str, comm: MPI.Comm | None, options: Any,
              check: Callable[[], tuple[Any, dict[str, Any]]]) -> tuple[Any, Options]:
    """The collective constructor of an object that holds MPI resources (the decentralized
    classes: ``Window``, ``ParameterServer``, ``PairwiseAveraging``, ``ChocoGossip``): the
    options resolved once as :func:`run_call` resolves them, ``check()`` (local checks, returning
    a value and a signature) agreed across ranks, so that every rank raises the same error
    together, then the communicator's context. Returns ``(context, options)``."""
    comm = MPI.COMM_WORLD if comm is None else comm
    check_comm(name, comm)
    opts, problem = resolve(options)

    def checks() -> tuple[Any, dict[str, Any]]:
        if problem is not None:
            raise problem
        return check()

    checked(name, comm, True, checks)
    return context(comm, opts), opts
