"""Cross-rank argument checks: what no rank can see alone (count, dtype, op, algorithm...).

Every public collective checks its own arguments locally before sending anything. With
``validate=True`` (or ``COLLECTIVES_VALIDATE=1``) it then runs one small collective in which each
rank contributes its argument signature and any local error; every rank then raises the same
error, so a mismatch or a bad argument on one rank fails everywhere instead of hanging.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from mpi4py import MPI

from ._context import context
from .options import Options

__all__ = ["checked", "pick", "setup"]

T = TypeVar("T")
_ERRORS = {"TypeError": TypeError, "ValueError": ValueError}


def pick(table: dict[str, Any], name: object, what: str) -> Any:
    """``table[name]``, or a ``ValueError`` that lists the valid names (the catalogues' lookup)."""
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown {what} {name!r}; valid choices: {', '.join(table)}")
    return table[name]


def setup(comm: MPI.Comm | None, options: Options | None,
          validate: bool | None) -> tuple[MPI.Comm, Options, bool]:
    """The communicator (default ``COMM_WORLD``), options (default: from the environment) and
    whether to cross-check, of a public call."""
    comm = MPI.COMM_WORLD if comm is None else comm
    opts = Options.from_env() if options is None else options
    if not isinstance(opts, Options):
        raise TypeError(f"options must be a collectives.Options, got {type(opts).__name__}")
    return comm, opts, opts.validate if validate is None else bool(validate)


def checked(name: str, comm: MPI.Comm, validate: bool,
            check: Callable[[], tuple[T, dict[str, Any]]]) -> T:
    """Run ``check()`` (local checks returning a value and a signature); agree across ranks.

    Without ``validate`` a local error is raised at once on the rank that has it. With
    ``validate`` all ranks exchange signatures and errors and raise the same error together.
    """
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"{name}: comm must be an MPI intracommunicator, got {comm!r}")
    if not validate:
        return check()[0]
    try:
        value, signature = check()
        error = None
    except (TypeError, ValueError) as exc:
        value, signature, error = None, None, (type(exc).__name__, str(exc))
    everyone = context(comm).comm.allgather((signature, error))
    bad = [(rank, err) for rank, (_, err) in enumerate(everyone) if err is not None]
    if bad:
        ranks = ", ".join(str(rank) for rank, _ in bad)
        kind, message = bad[0][1]
        raise _ERRORS[kind](f"{name}: invalid arguments on rank {ranks}: {message}")
    differing = [key for key in signature if any(sig[key] != signature[key] for sig, _ in everyone)]
    if differing:
        detail = "; ".join(
            f"{key}: " + ", ".join(f"rank {rank}: {sig[key]}" for rank, (sig, _) in
                                   enumerate(everyone))
            for key in differing)
        raise ValueError(f"{name}: arguments differ across ranks ({detail})")
    return value  # type: ignore[return-value]
