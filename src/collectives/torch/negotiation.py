"""How Horovod's calls agree before they move data, and Horovod's ``join``.

Horovod's coordinator checks that every rank submitted the same operation (the same kind, shapes,
dtypes, op, root) before it runs it, and raises on every rank when they differ; ranks that
called ``hvd.join()`` take part in the others' allreduces with zeros until every rank has
joined. Here each call of :mod:`.mpi_ops` *negotiates* first: one ``allgather`` of a small
signature per call (or per group) on the process set's control communicator
(:func:`~.process_sets.control_of`), then :func:`check` reads the gathered signatures the same
way on every rank, so every rank takes the same decision: go on, or raise
:class:`HorovodInternalError` (a ``RuntimeError``, as Horovod's) naming the ranks that differ.

A signature is ``(kind, tensors, params)``: ``tensors`` a tuple of ``(shape, dtype)``,
``params`` what else must agree (op and scale factors, root rank). A joined rank's signature is
``("join", rounds)``: in :func:`join` it answers every round; when the others negotiate an
allreduce, it reduces zeros of the agreed shapes with them (:func:`join`'s ``zeros`` callback),
for any other kind the others raise (Horovod's "joined ranks can't take part in allgather"),
and when every signature is a join, ``join`` returns, on every rank, the highest rank among the
last to join.

Cost: one small ``allgather`` (latency ``log p`` rounds) per call or group, which is what
Horovod's negotiation costs too; ``DistributedOptimizer`` does not negotiate (its buckets are
named requests, :mod:`.optimizer`).
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["HorovodInternalError", "negotiate", "check", "join_rounds", "JOIN"]

JOIN = "join"


class HorovodInternalError(RuntimeError):
    """Horovod's error for an operation the ranks disagree on, or that joined ranks cannot do."""


def _where(sigs: list, differs: Callable[[Any], Any]) -> str:
    values: dict[Any, list[int]] = {}
    for r, s in enumerate(sigs):
        if s[0] != JOIN:
            values.setdefault(differs(s), []).append(r)
    return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {v}"
                     for v, rs in values.items())


def check(sigs: list) -> str | None:
    """None if the signatures agree (what a rank that joined may take part in), else the error
    message every rank raises. Kinds: "allreduce", "broadcast", "reducescatter" need equal
    signatures; "allgather" and "alltoall" equal dtypes and equal shapes but for the first
    dimension (an alltoall's parameters, each rank's own problem with its splits, are its
    caller's to read);
    "object" the same kind."""
    active = [s for s in sigs if s[0] != JOIN]
    if not active:
        return None
    kind = active[0][0]
    if any(s[0] != kind for s in active):
        return f"ranks called different collectives at the same point: {_where(sigs, lambda s: s[0])}"
    if len(active) < len(sigs) and kind != "allreduce":
        joined = [r for r, s in enumerate(sigs) if s[0] == JOIN]
        return (f"{kind} is not supported with joined ranks (ranks {joined} have called join(); "
                "only allreduce takes part zeros for them)")
    if len({len(s[1]) for s in active}) > 1:
        return f"{kind}: ranks passed different numbers of tensors: {_where(sigs, lambda s: len(s[1]))}"
    if kind in ("allgather", "alltoall"):
        key = lambda s: tuple((str(d), tuple(shape[1:]), len(shape)) for shape, d in s[1])  # noqa: E731
        if len({key(s) for s in active}) > 1:
            return (f"Mismatched {kind} tensor shapes or dtypes (all dimensions but the first "
                    f"must agree): {_where(sigs, lambda s: s[1])}")
    elif kind != "object" and len({(s[1], s[2]) for s in active}) > 1:
        what = "tensor shapes or dtypes" if len({s[1] for s in active}) > 1 else "arguments"
        return f"Mismatched {kind} {what}: {_where(sigs, lambda s: (s[1], s[2]))}"
    return None


def negotiate(control: Any, kind: str, tensors: tuple, params: tuple = ()) -> list:
    """Agree on one call (or one group) with the other ranks of ``control``; returns every
    rank's signature (joined ranks' included) or raises :class:`HorovodInternalError` on every
    rank where they disagree."""
    sigs = control.allgather((kind, tensors, params))
    problem = check(sigs)
    if problem is not None:
        raise HorovodInternalError(problem)
    return sigs


def join_rounds(control: Any, ranks: list[int], zeros: Callable[[tuple, tuple], None]) -> int:
    """Answer the other ranks' negotiations until every rank has joined (Horovod's ``join``);
    ``zeros(tensors, params)`` takes part in an agreed allreduce with zeros. Returns the highest
    of the ranks that joined last, as a rank of the default communicator (``ranks[i]``)."""
    rounds = 0
    while True:
        sigs = control.allgather((JOIN, rounds))
        if all(s[0] == JOIN for s in sigs):
            return ranks[max(r for r, s in enumerate(sigs) if s[1] == 0)]
        rounds += 1
        active = next(s for s in sigs if s[0] != JOIN)
        if active[0] == "allreduce" and check(sigs) is None:
            zeros(active[1], active[2])
