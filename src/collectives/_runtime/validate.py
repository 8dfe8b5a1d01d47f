"""Cross-rank argument checks: what no rank can see alone (count, dtype, op, algorithm...).

Every public collective checks its own arguments locally before sending anything. With
``validate=True`` (or ``COLLECTIVES_VALIDATE=1``) it then runs one small collective in which each
rank contributes its argument signature and any local error; every rank then raises the same
error, so a mismatch or a bad argument on one rank fails everywhere instead of hanging.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from mpi4py import MPI

from .context import context
from .guard import everywhere
from ..observe import OBSERVERS
from ..options import Options

__all__ = ["check_comm", "checked", "checked_call", "lookup", "resolve", "setup", "verdict"]

T = TypeVar("T")
_ERRORS = {"TypeError": TypeError, "ValueError": ValueError}


def lookup(table: dict[str, Any], name: object, what: str) -> Any:
    """``table[name]``, or a ``ValueError`` that lists the valid names (the catalogues' lookup)."""
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown {what} {name!r}; valid choices: {', '.join(table)}")
    return table[name]


def resolve(options: Any) -> tuple[Options, TypeError | None]:
    """The options a call runs under (``None``: the environment's) and the error to raise for
    options of the wrong type (the environment's stand in until it is raised), or None."""
    if options is None:
        return Options.from_env(), None
    if isinstance(options, Options):
        return options, None
    return Options.from_env(), TypeError(f"options must be a collectives.Options, got "
                                         f"{type(options).__name__}")


def setup(comm: MPI.Comm | None, options: Options | None,
          validate: bool | None) -> tuple[MPI.Comm, Options, bool]:
    """The communicator (default ``COMM_WORLD``), options (default: from the environment) and
    whether to cross-check, of a public non-blocking call (the blocking ones:
    :func:`.blocking.run_call`)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    opts, problem = resolve(options)
    if problem is not None:
        raise problem
    timeline_option(opts, comm)
    return comm, opts, opts.validate if validate is None else bool(validate)


def timeline_option(options: Any, comm: MPI.Comm) -> None:
    """``Options.timeline``: tell the observers of ``timeline_option`` (:mod:`.observe`;
    ``collectives.timeline`` registers there when imported: the first call made with it starts
    the recording over ``comm``, before the call's guard runs, so that the call is its first
    span)."""
    path = getattr(options, "timeline", None)
    if path is not None:
        for observe in OBSERVERS.timeline_option:
            observe(path, comm)


def check_comm(name: str, comm: object) -> None:
    """Raise ``TypeError`` unless ``comm`` is a usable intracommunicator."""
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"{name}: comm must be an MPI intracommunicator, got {comm!r}")


def checked(name: str, comm: MPI.Comm, validate: bool,
            check: Callable[[], tuple[T, dict[str, Any]]]) -> T:
    """Run ``check()`` (local checks returning a value and a signature); agree across ranks.

    Without ``validate`` a local error is raised at once on the rank that has it. With
    ``validate`` all ranks exchange signatures and errors and raise the same error together.
    """
    check_comm(name, comm)
    if not validate:
        return check()[0]
    try:
        value, signature = check()
        error = None
    except Exception as exc:  # noqa: BLE001 - every rank must reach the exchange below
        value, signature, error = None, None, local_error(exc)
    problem = verdict(name, context(comm).comm.allgather((signature, error)))
    if problem is not None:
        raise problem
    return value  # type: ignore[return-value]


def local_error(exc: Exception) -> tuple[str, str]:
    """What a rank tells the others about its own bad argument."""
    return type(exc).__name__, str(exc)


def verdict(name: str, everyone: list[tuple[dict[str, Any] | None, tuple[str, str] | None]]
            ) -> Exception | None:
    """The error every rank raises, given every rank's ``(signature, error)``; None if they agree.

    Built from the exchanged data only, so every rank builds the same message; raised by every
    rank together (:class:`~.guard.RaisedEverywhere`: no notice).
    """
    bad = [(rank, err) for rank, (_, err) in enumerate(everyone) if err is not None]
    if bad:
        ranks = ", ".join(str(rank) for rank, _ in bad)
        kind, message = bad[0][1]
        return everywhere(_ERRORS.get(kind, ValueError),
                          f"{name}: invalid arguments on rank {ranks}: {message}")
    first = everyone[0][0]
    keys = list(first)
    keys += [key for sig, _ in everyone for key in sig if key not in keys]
    differing = [key for key in keys if any(sig.get(key) != first.get(key) for sig, _ in everyone)]
    if not differing:
        return None
    detail = "; ".join(
        f"{key}: " + ", ".join(f"rank {rank}: {sig.get(key)}" for rank, (sig, _) in
                               enumerate(everyone))
        for key in differing)
    return everywhere(ValueError, f"{name}: arguments differ across ranks ({detail})")


def checked_call(cls: type, comm: MPI.Comm, validate: bool, *args: Any) -> Any:
    """``cls(comm, *args)``, with the cross-rank check of ``validate`` (the module docstring)."""
    if not validate:
        check_comm(cls.kind, comm)
        return cls(comm, *args)

    def check():
        call = cls(comm, *args)
        return call, call.signature()

    return checked(cls.kind, comm, True, check)
