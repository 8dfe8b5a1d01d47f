"""Cross-rank argument checks: what no rank can see alone (count, dtype, op, algorithm...).

Every public collective checks its own arguments locally before sending anything. With
``validate=True`` (or ``COLLECTIVES_VALIDATE=1``) it then runs one small collective in which each
rank contributes its argument signature and any local error; every rank then raises the same
error, so a mismatch or a bad argument on one rank fails everywhere instead of hanging.

Inside a public call that exchange is point-to-point messages of exact sizes under the call's
guard (:func:`exchange`): its waits keep the call's deadline (``Options.timeout``: a rank that
never arrives makes the others raise ``TimeoutError``) and read failure notices (a rank that
ran another operation meanwhile fails, and with it every rank). Outside one (the collective
constructors, abort mode) it is MPI's allgather.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, TypeVar

import numpy as np
from mpi4py import MPI

from .context import context
from .guard import everywhere
from ..observe import OBSERVERS
from ..options import Options

__all__ = ["check_comm", "checked", "checked_call", "exchange", "lookup", "resolve", "setup",
           "verdict"]

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
    problem = verdict(name, exchange(comm, (signature, error)))
    if problem is not None:
        raise problem
    return value  # type: ignore[return-value]


def exchange(comm: MPI.Comm, mine: Any) -> list[Any]:
    """Every rank's ``mine`` (picklable), in rank order, on every rank of ``comm``; collective.

    Inside a public call (its guard active on ``comm``'s context) each rank sends the length of
    its pickled ``mine`` to every other rank, then the bytes, all under the guard: exact sizes,
    the call's deadline, failure notices (the module docstring); the call's tag keeps the
    messages apart from other calls', and MPI's order between two ranks keeps them apart from
    the call's own messages after them. Outside one, ``MPI_Allgather`` (mpi4py's
    ``allgather``)."""
    ctx = context(comm)
    guard, c = ctx.active, ctx.comm
    if guard is None or c.size == 1:
        return c.allgather(mine)
    p, r = c.size, c.rank
    data = np.frombuffer(pickle.dumps(mine), dtype=np.uint8)
    lengths = np.zeros(p, dtype=np.int64)
    lengths[r] = data.size
    peers = [q for q in range(p) if q != r]
    _all_to_all(c, guard, [lengths[r:r + 1]] * len(peers), [lengths[q:q + 1] for q in peers],
                peers)
    got = {q: np.empty(int(lengths[q]), dtype=np.uint8) for q in peers}
    _all_to_all(c, guard, [data] * len(peers), [got[q] for q in peers], peers)
    return [mine if q == r else pickle.loads(got[q].tobytes()) for q in range(p)]


def _all_to_all(comm: MPI.Comm, guard: Any, sends: list[np.ndarray], recvs: list[np.ndarray],
                peers: list[int]) -> None:
    """Send ``sends[i]`` to ``peers[i]`` while receiving exactly ``recvs[i]``'s bytes from it,
    waited for by ``guard``."""
    tag = guard.tag
    reqs = [comm.Irecv([b, MPI.BYTE], q, tag) for b, q in zip(recvs, peers)] + \
        [comm.Isend([a, MPI.BYTE], q, tag) for a, q in zip(sends, peers)]
    guard.complete(reqs, [b.nbytes for b in recvs] + [None] * len(sends), peers + peers)


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
