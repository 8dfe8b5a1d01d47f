"""torch.distributed's gather, scatter and point-to-point calls on tensors, over the library's.

The names and arguments are ``torch.distributed``'s, so that code written for it reads the same:

- ``gather(tensor, gather_list=None, dst=0, group=None, async_op=False)``: every rank's
  ``tensor`` into ``gather_list`` on ``dst`` (a list of as many tensors as the group has ranks,
  each of ``tensor``'s element count and dtype; None or empty elsewhere);
- ``scatter(tensor, scatter_list=None, src=0, group=None, async_op=False)``: tensor ``rank`` of
  ``src``'s ``scatter_list`` into every rank's ``tensor``;
- ``send(tensor, dst, group=None, tag=0)``, ``recv(tensor, src=None, group=None, tag=0)``
  (returns the sender's rank; ``src=None`` takes a message from any rank), ``isend`` and
  ``irecv`` (a :class:`Work`: ``wait()``, ``is_completed()``, and for a receive
  ``source_rank()``).

``barrier`` and ``alltoall`` are Horovod's (:mod:`.mpi_ops`; ``barrier(group)`` reads as
torch's). Underneath are :func:`collectives.gather`, :func:`collectives.scatter` (their
non-blocking forms on the progress engine with ``async_op=True``) and the point-to-point calls
of :mod:`collectives.pt2pt`, on the group's communicator: their checks (count and dtype of
a message, ``Options.timeout`` through ``options=``) and their failure semantics.

``group`` is a :class:`~.process_sets.ProcessSet` (this package's groups, Horovod's name), or
None for every rank; ``comm=`` may name an mpi4py communicator instead. As in torch, ``dst`` and
``src`` are ranks of the default (global) communicator, and ``recv`` returns one.

Errors: a gather or scatter's arguments are agreed before any data moves, as the library's
calls agree on theirs with ``validate=True`` (one small allgather on the library's private
duplicate of the group's communicator, :func:`collectives._runtime.validate.checked`): a bad
``gather_list`` or ``scatter_list`` on one rank, tensors of different shapes or dtypes, or
different roots raise the same ``ValueError`` on every rank, naming the ranks (of the group).
Point-to-point calls are not collective: a bad argument raises on the caller, as
:func:`collectives.send` does.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from mpi4py import MPI

from .. import api
from .._runtime.validate import checked
from ..engine import nonblocking
from ..pt2pt import messages
from .process_sets import ProcessSet, comm_of, resolve

__all__ = ["gather", "scatter", "send", "recv", "isend", "irecv", "Work"]


class Work:
    """An operation in flight (``async_op=True``, ``isend``, ``irecv``), as torch's ``Work``:
    ``wait()`` waits for it (``timeout`` in seconds, default the call's ``Options.timeout``)
    and returns True; ``is_completed()`` says whether it is done; ``source_rank()`` is the
    sender of a receive."""

    __slots__ = ("_request", "_finish", "_done", "_source")

    def __init__(self, request: Any, finish: Callable[[], None] | None = None,
                 source: Callable[[], int] | None = None) -> None:
        self._request, self._finish, self._source = request, finish, source
        self._done = False

    def wait(self, timeout: float | None = None) -> bool:
        if not self._done:
            self._request.wait(timeout)
            if self._finish is not None:
                self._finish()
            self._done = True
        return True

    def is_completed(self) -> bool:
        if not self._done and self._request.test():
            self.wait()
        return self._done

    def source_rank(self) -> int:
        if self._source is None:
            raise ValueError("source_rank() is a receive's (irecv)")
        self.wait()
        return self._source()


def _local(ps: ProcessSet, comm: Any, rank: Any, what: str) -> tuple[int, str | None]:
    """``rank`` (of the global communicator) as a rank of the group's ``comm``, or the reason
    it is not one."""
    if not isinstance(rank, int) or isinstance(rank, bool):
        return -1, f"{what} must be an int (a rank), got {rank!r}"
    if ps.ranks is None:
        if 0 <= rank < comm.size:
            return rank, None
        return -1, f"{what}={rank} is not a rank of the group (0 to {comm.size - 1})"
    if rank not in ps.ranks:
        return -1, f"{what}={rank} is not in the group (ranks {ps.ranks})"
    return ps.ranks.index(rank), None


def _global(ps: ProcessSet, rank: int) -> int:
    return rank if ps.ranks is None or rank < 0 else ps.ranks[rank]


def _check_list(kind: str, name: str, tensors: Any, like: torch.Tensor, p: int) -> str | None:
    """Why ``tensors`` is not a list of ``p`` tensors of ``like``'s element count and dtype."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) != p or \
            not all(isinstance(t, torch.Tensor) for t in tensors):
        got = f"{len(tensors)} items" if isinstance(tensors, (list, tuple)) else repr(tensors)
        return f"{kind}: {name} must be a list of {p} tensors (one per rank of the group), got {got}"
    for j, t in enumerate(tensors):
        if t.dtype != like.dtype or t.numel() != like.numel():
            return (f"{kind}: {name}[{j}] has {t.numel()} elements of {t.dtype}; every tensor "
                    f"must have tensor's {like.numel()} elements of {like.dtype}")
    return None


def _agree(kind: str, comm: Any, tensor: torch.Tensor, root: int, problem: str | None) -> None:
    """Agree with the group's other ranks on ``tensor``'s shape and dtype and on the root, and
    on whether any rank has a ``problem``: the same ValueError on every rank, or none."""

    def check() -> tuple[None, dict[str, Any]]:
        if problem is not None:
            raise ValueError(problem)
        return None, {"shape": tuple(tensor.shape), "dtype": str(tensor.dtype), "root": root}

    checked(kind, comm, True, check)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D tensor of ``tensor``'s memory, or a copy when it is not contiguous."""
    return tensor.detach().reshape(-1) if tensor.is_contiguous() else \
        tensor.detach().contiguous().view(-1)


def _start(blocking: Callable[[], Any], start: Callable[[], Any], finish: Callable[[], None],
           async_op: bool) -> Work | None:
    """A collective run now (``blocking()`` then ``finish()``), or started (``async_op``)."""
    if async_op:
        return Work(start(), finish)
    blocking()
    finish()
    return None


def _rooted(name: str, rootname: str, root_arg: int, listname: str,
            tensors: Sequence[torch.Tensor] | None, tensor: torch.Tensor,
            group: ProcessSet | None, comm: Any) -> tuple[Any, int]:
    """``(communicator, root)`` of a gather or scatter, its arguments agreed on every rank
    (the root's list of ``tensor``-like tensors, none elsewhere) before any message."""
    ps = resolve(group, comm)
    c = comm_of(ps)
    root, problem = _local(ps, c, root_arg, f"{name}: {rootname}")
    if problem is None and c.rank == root:
        problem = _check_list(name, listname, tensors, tensor, c.size)
    elif problem is None and tensors:
        problem = (f"{name}: {listname} must be None or empty on the ranks other than "
                   f"{rootname}")
    _agree(name, c, tensor, root, problem)
    return c, root


def gather(tensor: torch.Tensor, gather_list: Sequence[torch.Tensor] | None = None,
           dst: int = 0, group: ProcessSet | None = None, async_op: bool = False, *,
           comm: Any = None, options: Any = None) -> Work | None:
    """Every rank's ``tensor`` into ``gather_list`` on ``dst`` (torch.distributed.gather)."""
    c, root = _rooted("gather", "dst", dst, "gather_list", gather_list, tensor, group, comm)
    src = _flat(tensor)
    out = torch.empty(c.size * src.numel(), dtype=src.dtype) if c.rank == root else None

    def finish() -> None:
        if out is not None:
            with torch.no_grad():
                for g, part in zip(gather_list, out.view(c.size, -1)):
                    g.copy_(part.view(g.shape))

    return _start(lambda: api.gather(src, root=root, out=out, comm=c, options=options),
                  lambda: nonblocking.igather(src, root=root, out=out, comm=c, options=options),
                  finish, async_op)


def scatter(tensor: torch.Tensor, scatter_list: Sequence[torch.Tensor] | None = None,
            src: int = 0, group: ProcessSet | None = None, async_op: bool = False, *,
            comm: Any = None, options: Any = None) -> Work | None:
    """Tensor ``rank`` of ``src``'s ``scatter_list`` into every rank's ``tensor``
    (torch.distributed.scatter)."""
    c, root = _rooted("scatter", "src", src, "scatter_list", scatter_list, tensor, group, comm)
    x = torch.cat([t.detach().reshape(-1) for t in scatter_list]) if c.rank == root else None
    out = _flat(tensor)

    def finish() -> None:
        if not tensor.is_contiguous():
            with torch.no_grad():
                tensor.copy_(out.view(tensor.shape))

    return _start(lambda: api.scatter(x, root=root, out=out, comm=c, options=options),
                  lambda: nonblocking.iscatter(x, root=root, out=out, comm=c, options=options),
                  finish, async_op)


def _peer(kind: str, ps: ProcessSet, c: Any, rank: Any, what: str) -> int:
    peer, problem = _local(ps, c, rank, f"{kind}: {what}")
    if problem is not None:
        raise ValueError(problem)
    return peer


def send(tensor: torch.Tensor, dst: int, group: ProcessSet | None = None, tag: int = 0, *,
         comm: Any = None, options: Any = None) -> None:
    """Send ``tensor`` to ``dst`` (torch.distributed.send); the receiver's tensor must have its
    element count and dtype (:func:`collectives.send`)."""
    ps = resolve(group, comm)
    c = comm_of(ps)
    messages.send(_flat(tensor), _peer("send", ps, c, dst, "dst"), tag=tag, comm=c,
                  options=options)


def _receive(tensor: torch.Tensor, src: int | None, group: ProcessSet | None, tag: int,
             comm: Any, kind: str) -> tuple[ProcessSet, Any, int, torch.Tensor, Callable[[], None]]:
    """What a receive needs: the group, its communicator, the source (``MPI.ANY_SOURCE`` for
    None), the buffer received into and what copies it back into ``tensor`` when it is not
    ``tensor``'s own memory."""
    ps = resolve(group, comm)
    c = comm_of(ps)
    source = MPI.ANY_SOURCE if src is None else _peer(kind, ps, c, src, "src")
    buf = _flat(tensor)

    def back() -> None:
        if not tensor.is_contiguous():
            with torch.no_grad():
                tensor.copy_(buf.view(tensor.shape))

    return ps, c, source, buf, back


def recv(tensor: torch.Tensor, src: int | None = None, group: ProcessSet | None = None,
         tag: int = 0, *, comm: Any = None, options: Any = None) -> int:
    """Receive into ``tensor`` from ``src`` (None: any rank); return the sender's rank
    (torch.distributed.recv)."""
    ps, c, source, buf, back = _receive(tensor, src, group, tag, comm, "recv")
    status = MPI.Status()
    messages.recv(buf, source, tag=tag, comm=c, options=options, status=status)
    back()
    return _global(ps, status.source)


def isend(tensor: torch.Tensor, dst: int, group: ProcessSet | None = None, tag: int = 0, *,
          comm: Any = None, options: Any = None) -> Work:
    """Start sending ``tensor`` to ``dst`` (torch.distributed.isend); ``wait()`` before writing
    ``tensor`` again."""
    ps = resolve(group, comm)
    c = comm_of(ps)
    buf = _flat(tensor)
    request = messages.isend(buf, _peer("isend", ps, c, dst, "dst"), tag=tag, comm=c,
                             options=options)
    return Work(request)


def irecv(tensor: torch.Tensor, src: int | None = None, group: ProcessSet | None = None,
          tag: int = 0, *, comm: Any = None, options: Any = None) -> Work:
    """Start receiving into ``tensor`` (torch.distributed.irecv); ``wait()`` before reading it,
    ``source_rank()`` names the sender."""
    ps, c, source, buf, back = _receive(tensor, src, group, tag, comm, "irecv")
    status = MPI.Status()
    request = messages.irecv(buf, source, tag=tag, comm=c, options=options, status=status)
    return Work(request, back, lambda: _global(ps, status.source))
