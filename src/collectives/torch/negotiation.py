"""How Horovod's calls agree before they move data.

Horovod's coordinator checks that every rank submitted the same operation (the same kind, shapes,
dtypes, op, root) before it runs it, and raises on every rank when they differ. Here the tensor
collectives of :mod:`.mpi_ops` are operations of the progress engine's *named stream*
(:mod:`collectives.engine.named`), Horovod's coordinator in the library: each call is submitted
under its name (or an automatic one) and returns at once; a background thread negotiates in
rounds and runs a name once every rank has submitted it, in rank 0's order. A call's signature
is ``(kind, tensors, params)`` (a dict of the three as the stream carries it): ``tensors`` a
tuple of ``(shape, dtype)``, ``params`` what else must agree (op and scale factors, root rank).
The stream hands every rank's signature to :func:`agree`, the rule that the Horovod operations
bring (``_Op.agree``), which reads them the same way on every rank, so every rank takes the
same decision: run, or complete the call with :class:`HorovodInternalError` (a
``RuntimeError``, as Horovod's) naming the ranks that differ.

``hvd.join()`` is the stream's join (:func:`collectives.engine.calls.join`): a joined rank
takes part in the others' allreduces with zeros of the agreed shapes (:data:`STANDS_IN`);
the others' other collectives raise (Horovod's "joined ranks can't take part in allgather").

:func:`negotiate` is the blocking form, one ``allgather`` of the signature on the process set's
control communicator (:func:`~.process_sets.control_of`), for the calls that do not go through
the stream (``barrier``, the object collectives).
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["HorovodInternalError", "negotiate", "check", "agree", "KINDS", "STANDS_IN"]

#: The Horovod operations of the named stream: Horovod's kind -> the stream's kind.
KINDS = {kind: f"horovod.{kind}"
         for kind in ("allreduce", "allgather", "broadcast", "reducescatter", "alltoall")}

#: The kinds a joined rank takes part in (with zeros).
STANDS_IN = (KINDS["allreduce"],)


class HorovodInternalError(RuntimeError):
    """Horovod's error for an operation the ranks disagree on, or that joined ranks cannot do."""


def _where(sigs: list, differs: Callable[[Any], Any]) -> str:
    values: dict[Any, list[int]] = {}
    for r, s in enumerate(sigs):
        values.setdefault(differs(s), []).append(r)
    return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {v}"
                     for v, rs in values.items())


def check(sigs: list) -> str | None:
    """None if the signatures agree, else the error message every rank raises. Kinds:
    "allreduce", "broadcast", "reducescatter" need equal signatures; "allgather" and "alltoall"
    equal dtypes and equal shapes but for the first dimension (an alltoall's parameters, each
    rank's own problem with its splits, are its caller's to read); "object" and "barrier" the
    same kind."""
    kind = sigs[0][0]
    if any(s[0] != kind for s in sigs):
        return f"ranks called different collectives at the same point: {_where(sigs, lambda s: s[0])}"
    if len({len(s[1]) for s in sigs}) > 1:
        return f"{kind}: ranks passed different numbers of tensors: {_where(sigs, lambda s: len(s[1]))}"
    if kind in ("allgather", "alltoall"):
        key = lambda s: tuple((str(d), tuple(shape[1:]), len(shape)) for shape, d in s[1])  # noqa: E731
        if len({key(s) for s in sigs}) > 1:
            return (f"Mismatched {kind} tensor shapes or dtypes (all dimensions but the first "
                    f"must agree): {_where(sigs, lambda s: s[1])}")
    elif kind not in ("object", "barrier") and len({(s[1], s[2]) for s in sigs}) > 1:
        what = "tensor shapes or dtypes" if len({s[1] for s in sigs}) > 1 else "arguments"
        return f"Mismatched {kind} {what}: {_where(sigs, lambda s: (s[1], s[2]))}"
    return None


def agree(what: str, sigs: list) -> HorovodInternalError | None:
    """The named stream's rule for the Horovod kinds (signatures as dicts: ``op``, ``tensors``,
    ``params``): :func:`check`'s error, or None."""
    problem = check([(s["op"], s["tensors"], s["params"]) for s in sigs])
    return None if problem is None else HorovodInternalError(f"{what}: {problem}")


def negotiate(control: Any, kind: str, tensors: tuple, params: tuple = ()) -> list:
    """Agree on one blocking call with the other ranks of ``control``; returns every rank's
    signature or raises :class:`HorovodInternalError` on every rank where they disagree."""
    sigs = control.allgather((kind, tensors, params))
    problem = check(sigs)
    if problem is not None:
        raise HorovodInternalError(problem)
    return sigs
