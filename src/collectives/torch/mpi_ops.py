"""Horovod's collectives on tensors (``horovod.torch.mpi_ops``): allreduce, allgather, broadcast,
reducescatter, alltoall, their grouped and asynchronous forms, handles, ``barrier``, ``join`` and
object collectives.

Every call runs over a process set (:mod:`.process_sets`; default: every rank) and goes the same
way: :func:`~.negotiation.negotiate` (every rank submitted the same thing, else
:class:`~.negotiation.HorovodInternalError` on every rank), then the library's non-blocking
collective on the set's communicator (:func:`collectives.iallreduce`, ``iallgather`` with
``counts``, ``ibcast``, ``ireduce_scatter``: the progress engine, :mod:`collectives.engine`), and
a *finish* step (scaling, reshaping, copying back) when it is waited for. The ``*_async``
forms return a handle (an int) at once: :func:`poll` says whether it is done, :func:`synchronize`
waits and returns the result; the others are ``synchronize(..._async(...))``.

Horovod's semantics kept here:

- ``op``: ``Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product``; ``average=True/False`` is
  the old spelling of Average/Sum. ``Adasum`` raises :class:`HorovodInternalError` (not offered).
  Average is a sum then a multiplication by ``1/size``; ``prescale_factor`` multiplies the input
  before the sum, ``postscale_factor`` the result after it. Integers are scaled in float64 and
  float16 in float32, and cast back (towards zero), as Horovod does on CPUs.
- ``allgather`` concatenates along the first dimension, which may differ from rank to rank.
- ``alltoall`` sends ``splits[j]`` rows (first dimension) to rank ``j``, equal parts without
  ``splits`` (the first dimension a multiple of the set's size), and returns the rows received in
  rank order, with the received splits (an int32 tensor) when ``splits`` was given; its backward
  is the reverse alltoall. It runs :func:`collectives.ialltoall` on the progress engine. Bad ``splits`` (not integers, negative, more rows than the tensor
  has) raise ``ValueError`` on the rank that passed them and :class:`HorovodInternalError` on
  the others, after the negotiation, so that no rank waits.
- ``barrier`` is :func:`collectives.barrier` on the set's communicator.
- ``reducescatter`` splits the first dimension: rank ``r`` gets ``d0 // p`` rows, one more for the
  first ``d0 % p`` ranks.
- ``root_rank`` (broadcast) and process-set ranks are ranks of the default communicator.
- a ``name`` may be in flight once per process set on a rank (a second ``ValueError``).
- Sum/Average allreduce, allgather, broadcast and reducescatter (and their grouped forms, not
  the async ones) are autograd functions: backward is the same allreduce of the gradients;
  average then this rank's slice (allgather); average, kept on the root, zero elsewhere
  (broadcast); allgather, times ``p`` for Sum (reducescatter).

``compression=`` / ``codec=`` on :func:`allreduce` (not Compression.none) takes the compressed
path of :func:`collectives.torch.functions.compressed_allreduce_`, which does not negotiate.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import torch

from .. import api
from ..engine import nonblocking
from ._common import codec_of
from .basics import Adasum, default_comm
from .functions import compressed_allreduce_
from .negotiation import HorovodInternalError, join_rounds, negotiate
from .process_sets import ProcessSet, comm_of, control_of, resolve

__all__ = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
           "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
           "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
           "broadcast_async_", "reducescatter", "reducescatter_async", "grouped_reducescatter",
           "grouped_reducescatter_async", "sparse_allreduce_async", "synchronize", "poll",
           "alltoall", "alltoall_async", "barrier", "join", "broadcast_object",
           "allgather_object", "HorovodInternalError"]

#: Horovod's op names (basics.Average ...) as ours; Adasum is refused by :func:`_op`.
OPS = ("avg", "sum", "min", "max", "prod")


# ---------------------------------------------------------------------------- handles
class _Pending:
    """An operation in flight: its requests, and what turns their buffers into the result."""

    __slots__ = ("requests", "finish", "name", "info")

    def __init__(self, requests: list, finish: Callable[[], Any], name: Any,
                 info: Any = None) -> None:
        self.requests, self.finish, self.name, self.info = requests, finish, name, info

    def test(self) -> bool:
        return all(r.test() for r in self.requests)

    def wait(self) -> Any:
        for r in self.requests:
            r.wait()
        return self.finish()


_HANDLES: dict[int, _Pending] = {}
_NEXT = itertools.count(1)
_NAMES: set = set()  # (process set, name) in flight on this rank


def _handle(pending: _Pending) -> int:
    h = next(_NEXT)
    _HANDLES[h] = pending
    return h


def poll(handle: int) -> bool:
    """Whether the operation of ``handle`` is done (``synchronize`` then returns at once)."""
    return _pending(handle).test()


def _pending(handle: int) -> _Pending:
    try:
        return _HANDLES[handle]
    except KeyError:
        raise ValueError(f"handle {handle!r} is not an operation in flight (synchronized "
                         "already, or not from an *_async call)") from None


def synchronize(handle: int) -> Any:
    """Wait for the operation of ``handle`` and return its result (a tensor, or a list)."""
    pending = _pending(handle)
    del _HANDLES[handle]
    try:
        return pending.wait()
    except HorovodInternalError:
        raise
    except Exception as exc:  # an engine failure: Horovod raises its internal error
        raise HorovodInternalError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        _NAMES.discard(pending.name)


def _claim(name: str | None, ps: ProcessSet) -> Any:
    if name is None:
        return None
    key = (id(ps), name)
    if key in _NAMES:
        raise ValueError(f"a collective named {name!r} is already in flight on this rank "
                         "(synchronize it first, or use another name)")
    _NAMES.add(key)
    return key


# ---------------------------------------------------------------------------- helpers
def _negotiated(kind: str, tensors: Sequence[torch.Tensor], params: tuple, name: str | None,
                process_set: ProcessSet | None, comm: Any) -> tuple[Any, Any]:
    """The start of a call of ``kind`` on ``tensors``: its set resolved, its ``name`` claimed and
    the call negotiated with the set's other ranks (the name released if that raises). Returns
    the name's key and the set's communicator."""
    ps = resolve(process_set, comm)
    key = _claim(name, ps)
    try:
        negotiate(control_of(ps), kind, tuple(_meta(t) for t in tensors), params)
    except BaseException:
        _NAMES.discard(key)
        raise
    return key, comm_of(ps)


def _op(average: bool | None, op: str | None) -> str:
    if average is not None and op is not None:
        raise ValueError("pass average= (Horovod's old spelling) or op=, not both")
    if average is not None:
        op = "avg" if average else "sum"
    op = "avg" if op is None else op
    if op == Adasum:
        raise HorovodInternalError("op=Adasum is not offered by collectives.torch (Horovod's "
                                   "Adasum reduction has no counterpart); use Average or Sum")
    if op not in OPS:
        raise ValueError(f"op must be one of Average, Sum, Min, Max, Product ({OPS}), got {op!r}")
    return op


def _meta(t: torch.Tensor) -> tuple:
    return tuple(t.shape), str(t.dtype).replace("torch.", "")


def _scale(t: torch.Tensor, factor: float) -> None:
    """``t *= factor`` in place, integers in float64 and float16 in float32 (Horovod's)."""
    if factor == 1.0:
        return
    if t.dtype in (torch.float32, torch.float64):
        t.mul_(factor)
    else:
        work = torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else torch.float64
        t.copy_(t.to(work).mul_(factor).to(t.dtype))


def _buffer(t: torch.Tensor, clone: bool) -> torch.Tensor:
    t = t.detach()
    return t.clone(memory_format=torch.contiguous_format) if clone or not t.is_contiguous() else t


def _write_back(targets: list[torch.Tensor], bufs: list[torch.Tensor]) -> None:
    for t, b in zip(targets, bufs):
        if t.data_ptr() != b.data_ptr():
            with torch.no_grad():
                t.copy_(b)


# ---------------------------------------------------------------------------- allreduce
def _allreduce_start(tensors: Sequence[torch.Tensor], inplace: bool, average: bool | None,
                     name: str | None, op: str | None, prescale: float, postscale: float,
                     process_set: ProcessSet | None, comm: Any) -> _Pending:
    op = _op(average, op)
    key, c = _negotiated("allreduce", tensors, (op, float(prescale), float(postscale)), name,
                         process_set, comm)
    bufs = [_buffer(t, not inplace) for t in tensors]
    requests = _reduce(bufs, op, prescale, c)
    post = postscale / c.size if op == "avg" else postscale

    def finish() -> Any:
        for b in bufs:
            _scale(b, post)
        if inplace:
            _write_back(list(tensors), bufs)
            return list(tensors)
        return bufs

    return _Pending(requests, finish, key)


def _reduce(bufs: list[torch.Tensor], op: str, prescale: float, comm: Any) -> list:
    for b in bufs:
        _scale(b, prescale)
    mpi_op = "sum" if op == "avg" else op
    return [nonblocking.iallreduce(b, out=b, op=mpi_op, comm=comm) for b in bufs]


def _zeros(comm: Any) -> Callable[[tuple, tuple], None]:
    """What a joined rank does in an allreduce of the others: reduce zeros of their shapes."""
    def run(tensors: tuple, params: tuple) -> None:
        bufs = [torch.zeros(shape, dtype=getattr(torch, dtype)) for shape, dtype in tensors]
        for r in _reduce(bufs, params[0], 1.0, comm):
            r.wait()
    return run


class _GroupedAllreduce(torch.autograd.Function):
    """Sum or average of every rank's tensors, differentiable: backward is the same reduction
    of the outputs' gradients (Horovod's ``HorovodAllreduce``/``HorovodGroupedAllreduce``)."""

    @staticmethod
    def forward(ctx: Any, args: tuple, *tensors: torch.Tensor) -> tuple:
        ctx.args = args
        return tuple(_allreduce_start(tensors, False, None, None, *args).wait())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        return (None, *_allreduce_start(grads, False, None, None, *ctx.args).wait())


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: str | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet | None = None, *, comm: Any = None) -> int:
    """Start reducing every rank's ``tensors`` into new tensors; a handle
    (``synchronize`` returns the list)."""
    return _handle(_allreduce_start(list(tensors), False, average, name, op, prescale_factor,
                                    postscale_factor, process_set, comm))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: str | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet | None = None, *, comm: Any = None) -> int:
    """Start reducing ``tensors`` in place; a handle."""
    return _handle(_allreduce_start(list(tensors), True, average, name, op, prescale_factor,
                                    postscale_factor, process_set, comm))


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression: Any = None, op: str | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet | None = None, *, comm: Any = None) -> list:
    """New tensors holding every rank's ``tensors`` reduced (one negotiation for the group);
    differentiable for Sum and Average."""
    tensors = list(tensors)
    if codec_of(None, compression) is not None:
        return [allreduce(t, average, name and f"{name}.{i}", compression, op, prescale_factor,
                          postscale_factor, process_set, comm=comm) for i, t in enumerate(tensors)]
    opname = _op(average, op)
    if opname in ("sum", "avg") and any(t.requires_grad for t in tensors):
        return list(_GroupedAllreduce.apply((opname, prescale_factor, postscale_factor,
                                             process_set, comm), *tensors))
    return synchronize(grouped_allreduce_async(tensors, None, name, opname, prescale_factor,
                                               postscale_factor, process_set, comm=comm))


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: str | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet | None = None, *, comm: Any = None) -> list:
    """Reduce ``tensors`` in place (outside autograd); returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set, comm=comm))


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: str | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: ProcessSet | None = None, *,
                    comm: Any = None, _inplace: bool = False) -> int:
    """Start reducing ``tensor`` into a new tensor; a handle (``synchronize`` returns it).
    (``_inplace``: :func:`allreduce_async_`'s.)"""
    pending = _allreduce_start([tensor], _inplace, average, name, op, prescale_factor,
                               postscale_factor, process_set, comm)
    return _handle(_Pending(pending.requests, lambda: pending.finish()[0], pending.name))


def allreduce_async_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    """Start reducing ``tensor`` in place: :func:`allreduce_async`'s arguments (Horovod's), a
    handle (``synchronize`` returns ``tensor``)."""
    return allreduce_async(tensor, *args, _inplace=True, **kwargs)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = None, op: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet | None = None, *,
              algorithm: str = "auto", codec: Any = None, error_feedback: bool | None = None,
              strategy: str = "auto", key: Any = None, comm: Any = None) -> torch.Tensor:
    """Horovod's ``hvd.allreduce``: a new tensor holding ``tensor`` reduced over the process
    set (by default averaged); ``tensor`` is left as it is. Differentiable for Sum/Average.

    Ours besides Horovod's: ``comm`` (a communicator instead of a process set), and the
    compressed path: ``codec``/``compression`` (not ``Compression.none``) with
    ``error_feedback``, ``strategy``, ``key``, ``algorithm`` (see
    :func:`collectives.torch.functions.compressed_allreduce_`; no negotiation, no autograd).
    """
    codec = codec_of(codec, compression)
    if codec is not None or algorithm != "auto":
        opname = _op(average, op)
        out = _buffer(tensor, True)
        _scale(out, prescale_factor)
        compressed_allreduce_(out, op=opname, algorithm=algorithm, codec=codec,
                              error_feedback=error_feedback, strategy=strategy,
                              key=name if key is None else key,
                              comm=comm_of(resolve(process_set, comm)))
        _scale(out, postscale_factor)
        return out
    return grouped_allreduce([tensor], average, name, None, op, prescale_factor,
                             postscale_factor, process_set, comm=comm)[0]


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: str | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: ProcessSet | None = None, *,
               algorithm: str = "auto", codec: Any = None, error_feedback: bool | None = None,
               strategy: str = "auto", key: Any = None, compression: Any = None,
               comm: Any = None) -> torch.Tensor:
    """Reduce ``tensor`` in place (outside autograd); returns it. Arguments as
    :func:`allreduce`."""
    codec = codec_of(codec, compression)
    if codec is not None or algorithm != "auto":
        with torch.no_grad():
            _scale(tensor, prescale_factor)
            compressed_allreduce_(tensor, op=_op(average, op), algorithm=algorithm, codec=codec,
                                  error_feedback=error_feedback, strategy=strategy,
                                  key=name if key is None else key,
                                  comm=comm_of(resolve(process_set, comm)))
            _scale(tensor, postscale_factor)
        return tensor
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set, comm=comm))


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None, op: str | None = None,
                           process_set: ProcessSet | None = None) -> Callable[[], torch.Tensor]:
    """Horovod's sparse allreduce: here the dense allreduce of ``tensor.to_dense()``; returns a
    function that waits and gives the sparse result (Horovod's handle is such a function)."""
    h = allreduce_async(tensor.to_dense(), None, name, op, process_set=process_set)
    return lambda: synchronize(h).to_sparse()


# ---------------------------------------------------------------------------- allgather
def _allgather_start(tensors: Sequence[torch.Tensor], name: str | None,
                     process_set: ProcessSet | None, comm: Any) -> _Pending:
    ps = resolve(process_set, comm)
    key = _claim(name, ps)
    tensors = [t.detach().reshape(1) if t.dim() == 0 else t.detach() for t in tensors]
    try:
        sigs = negotiate(control_of(ps), "allgather", tuple(_meta(t) for t in tensors))
    except BaseException:
        _NAMES.discard(key)
        raise
    c = comm_of(ps)
    requests, outs, all_firsts = [], [], []
    for i, t in enumerate(tensors):
        firsts = [s[1][i][0][0] for s in sigs]
        all_firsts.append(firsts)
        row = t[0].numel() if t.shape[0] else int(torch.Size(t.shape[1:]).numel())
        out = torch.empty((sum(firsts), *t.shape[1:]), dtype=t.dtype, device=t.device)
        src = t.contiguous().view(-1)
        requests.append(nonblocking.iallgather(src, out=out.view(-1),
                                               counts=[f * row for f in firsts], comm=c))
        outs.append(out)
    return _Pending(requests, lambda: outs, key, all_firsts)


class _GroupedAllgather(torch.autograd.Function):
    """Concatenation along the first dimension, differentiable: backward averages the outputs'
    gradients over the ranks and keeps this rank's rows (Horovod's ``HorovodAllgather``)."""

    @staticmethod
    def forward(ctx: Any, args: tuple, *tensors: torch.Tensor) -> tuple:
        ctx.args = args
        process_set, comm = args
        pending = _allgather_start(tensors, None, process_set, comm)
        ctx.firsts, ctx.scalar = pending.info, [t.dim() == 0 for t in tensors]
        ctx.rank = comm_of(resolve(process_set, comm)).rank
        return tuple(pending.wait())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        process_set, comm = ctx.args
        reduced = _allreduce_start(grads, False, None, None, "avg", 1.0, 1.0, process_set,
                                   comm).wait()
        out = []
        for g, firsts, scalar in zip(reduced, ctx.firsts, ctx.scalar):
            lo = sum(firsts[:ctx.rank])
            part = g[lo:lo + firsts[ctx.rank]]
            out.append(part.reshape(()) if scalar else part)
        return (None, *out)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet | None = None, *, comm: Any = None) -> int:
    """Start gathering every rank's ``tensors``; a handle (``synchronize`` returns the list)."""
    return _handle(_allgather_start(list(tensors), name, process_set, comm))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet | None = None, *, comm: Any = None) -> list:
    """Every rank's ``tensors`` concatenated along the first dimension (which may differ per
    rank), one negotiation for the group; differentiable."""
    tensors = list(tensors)
    if any(t.requires_grad for t in tensors):
        return list(_GroupedAllgather.apply((process_set, comm), *tensors))
    return synchronize(grouped_allgather_async(tensors, name, process_set, comm=comm))


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet | None = None, *, comm: Any = None) -> int:
    """Start gathering every rank's ``tensor``; a handle (``synchronize`` returns the tensor)."""
    pending = _allgather_start([tensor], name, process_set, comm)
    return _handle(_Pending(pending.requests, lambda: pending.finish()[0], pending.name))


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet | None = None, *, comm: Any = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order (the first
    dimension may differ from rank to rank, the others not); differentiable."""
    return grouped_allgather([tensor], name, process_set, comm=comm)[0]


# ---------------------------------------------------------------------------- broadcast
def _broadcast_start(tensor: torch.Tensor, root_rank: int, inplace: bool, name: str | None,
                     process_set: ProcessSet | None, comm: Any) -> _Pending:
    ps = resolve(process_set, comm)
    key = _claim(name, ps)
    try:
        negotiate(control_of(ps), "broadcast", (_meta(tensor),), (int(root_rank),))
        ranks = ps.ranks
        if ranks is not None and root_rank not in ranks:
            raise HorovodInternalError(f"root_rank {root_rank} is not in the process set "
                                       f"(ranks {ranks})")
    except BaseException:
        _NAMES.discard(key)
        raise
    c = comm_of(ps)
    root = int(root_rank) if ranks is None else ranks.index(root_rank)
    if not 0 <= root < c.size:
        _NAMES.discard(key)
        raise HorovodInternalError(f"root_rank {root_rank} is not a rank of the process set "
                                   f"(size {c.size})")
    buf = _buffer(tensor, not inplace)
    request = nonblocking.ibcast(buf, root=root, comm=c)

    def finish() -> torch.Tensor:
        if inplace:
            _write_back([tensor], [buf])
            return tensor
        return buf

    return _Pending([request], finish, key)


class _Broadcast(torch.autograd.Function):
    """The root's tensor on every rank, differentiable: backward averages the gradients over the
    ranks and keeps them on the root, zeros elsewhere (Horovod's ``HorovodBroadcast``)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, process_set: Any,
                comm: Any) -> torch.Tensor:
        ctx.args = (root_rank, process_set, comm)
        return _broadcast_start(tensor, root_rank, False, None, process_set, comm).wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        root_rank, process_set, comm = ctx.args
        g = _allreduce_start([grad], False, None, None, "avg", 1.0, 1.0, process_set,
                             comm).wait()[0]
        if default_comm().rank != root_rank if comm is None else comm.rank != root_rank:
            g.zero_()
        return g, None, None, None


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet | None = None, *, comm: Any = None) -> int:
    """Start copying the root's ``tensor`` into a new tensor on every rank; a handle."""
    return _handle(_broadcast_start(tensor, root_rank, False, name, process_set, comm))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet | None = None, *, comm: Any = None) -> int:
    """Start copying the root's ``tensor`` into ``tensor`` on every rank; a handle."""
    return _handle(_broadcast_start(tensor, root_rank, True, name, process_set, comm))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet | None = None, *, comm: Any = None) -> torch.Tensor:
    """A new tensor holding ``root_rank``'s ``tensor`` (a rank of the default communicator);
    differentiable."""
    if tensor.requires_grad:
        return _Broadcast.apply(tensor, root_rank, process_set, comm)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set, comm=comm))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet | None = None, *, comm: Any = None) -> torch.Tensor:
    """Copy ``root_rank``'s ``tensor`` into ``tensor`` on every rank (outside autograd)."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set, comm=comm))


# ---------------------------------------------------------------------------- reducescatter
def _reducescatter_start(tensors: Sequence[torch.Tensor], name: str | None, op: str | None,
                         prescale: float, postscale: float, process_set: ProcessSet | None,
                         comm: Any) -> _Pending:
    op = _op(None, op)
    if op not in ("sum", "avg"):
        raise ValueError(f"reducescatter takes op=Sum or Average, got {op!r}")
    for t in tensors:
        if t.dim() == 0:
            raise ValueError("reducescatter needs tensors of at least one dimension (it splits "
                             "the first), got a scalar")
    key, c = _negotiated("reducescatter", tensors, (op, float(prescale), float(postscale)),
                         name, process_set, comm)
    p, me = c.size, c.rank
    requests, outs = [], []
    for t in tensors:
        buf = _buffer(t, True)
        _scale(buf, prescale)
        d0 = t.shape[0]
        rows = [d0 // p + (1 if r < d0 % p else 0) for r in range(p)]
        row = int(torch.Size(t.shape[1:]).numel())
        out = torch.empty((rows[me], *t.shape[1:]), dtype=t.dtype, device=t.device)
        requests.append(nonblocking.ireduce_scatter(buf.view(-1), out=out.view(-1), op="sum",
                                                    counts=[n * row for n in rows], comm=c))
        outs.append(out)
    post = postscale / p if op == "avg" else postscale

    def finish() -> list:
        for o in outs:
            _scale(o, post)
        return outs

    return _Pending(requests, finish, key)


class _GroupedReducescatter(torch.autograd.Function):
    """Reduce-scatter along the first dimension, differentiable: backward gathers the outputs'
    gradients, times the set's size for Sum (Horovod's ``HorovodReducescatter``)."""

    @staticmethod
    def forward(ctx: Any, args: tuple, *tensors: torch.Tensor) -> tuple:
        ctx.args = args
        return tuple(_reducescatter_start(tensors, None, *args).wait())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        op, _, _, process_set, comm = ctx.args
        gathered = _allgather_start(grads, None, process_set, comm).wait()
        if op == "sum":
            p = comm_of(resolve(process_set, comm)).size
            gathered = [g * p for g in gathered]
        return (None, *gathered)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: str | None = None, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0,
                                process_set: ProcessSet | None = None, *, comm: Any = None) -> int:
    """Start reduce-scattering ``tensors``; a handle (``synchronize`` returns the list)."""
    return _handle(_reducescatter_start(list(tensors), name, op, prescale_factor,
                                        postscale_factor, process_set, comm))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: Any = None, op: str | None = None,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set: ProcessSet | None = None, *, comm: Any = None) -> list:
    """Every rank's ``tensors`` reduced (Sum or Average), rank ``r`` keeping its block of rows
    of each; differentiable."""
    if codec_of(None, compression) is not None:
        raise ValueError("reducescatter takes no compression (Compression.none only)")
    tensors = list(tensors)
    opname = _op(None, op)
    if any(t.requires_grad for t in tensors):
        return list(_GroupedReducescatter.apply((opname, prescale_factor, postscale_factor,
                                                 process_set, comm), *tensors))
    return synchronize(grouped_reducescatter_async(tensors, name, opname, prescale_factor,
                                                   postscale_factor, process_set, comm=comm))


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: str | None = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set: ProcessSet | None = None, *, comm: Any = None) -> int:
    """Start reduce-scattering ``tensor``; a handle (``synchronize`` returns this rank's rows)."""
    pending = _reducescatter_start([tensor], name, op, prescale_factor, postscale_factor,
                                   process_set, comm)
    return _handle(_Pending(pending.requests, lambda: pending.finish()[0], pending.name))


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = None,
                  op: str | None = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0, process_set: ProcessSet | None = None, *,
                  comm: Any = None) -> torch.Tensor:
    """``tensor`` reduced over the ranks (Sum or Average, default Average); rank ``r`` gets its
    block of the first dimension (``d0 // p`` rows, one more on the first ``d0 % p`` ranks)."""
    return grouped_reducescatter([tensor], name, compression, op, prescale_factor,
                                 postscale_factor, process_set, comm=comm)[0]


# ---------------------------------------------------------------------------- join, objects
# ---------------------------------------------------------------------------- alltoall, barrier
def _rows_to_send(t: torch.Tensor, splits: Any, p: int) -> tuple[list[int] | None, str | None]:
    """The rows for each rank (``splits``, or equal parts), or the reason they are bad."""
    d0 = t.shape[0]
    if splits is None:
        if d0 % p:
            return None, (f"alltoall without splits needs a first dimension divisible by the "
                          f"{p} ranks, got {d0}")
        return [d0 // p] * p, None
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64) or splits.dim() != 1:
            return None, f"splits must be a 1-D int32 tensor, got {splits.dtype} of {splits.dim()}-D"
        splits = splits.tolist()
    rows = list(splits)
    if len(rows) != p or not all(isinstance(r, int) and r >= 0 for r in rows):
        return None, f"splits must be {p} non-negative integers (one per rank), got {rows}"
    if sum(rows) > d0:
        return None, f"splits sum to {sum(rows)}, more than the tensor's {d0} rows"
    return rows, None


def _alltoall_start(tensor: torch.Tensor, splits: Any, name: str | None,
                    process_set: ProcessSet | None, comm: Any) -> _Pending:
    ps = resolve(process_set, comm)
    key = _claim(name, ps)
    try:
        c = comm_of(ps)
        t = tensor.detach()
        t = t.reshape(1) if t.dim() == 0 else t
        rows, problem = _rows_to_send(t, splits, c.size)
        sigs = negotiate(control_of(ps), "alltoall", (_meta(t),), (problem,))
        if problem is not None:
            raise ValueError(problem)
        bad = [(r, s[2][0]) for r, s in enumerate(sigs) if s[2] and s[2][0] is not None]
        if bad:
            raise HorovodInternalError("alltoall: " + "; ".join(f"rank {r}: {why}"
                                                               for r, why in bad))
    except BaseException:
        _NAMES.discard(key)
        raise
    row = int(torch.Size(t.shape[1:]).numel())
    src = t[:sum(rows)].contiguous().view(-1)
    if row:  # on the progress engine: the handle returns at once
        request = nonblocking.ialltoall(src, counts=[r * row for r in rows], comm=c)

        def finish() -> tuple:
            flat, got = request.wait()
            received = [g // row for g in got]
            return (torch.as_tensor(flat).view(sum(received), *t.shape[1:]),
                    torch.tensor(received, dtype=torch.int32))

        return _Pending([request], finish, key)
    received = c.alltoall(rows)  # rows of no elements: only the counts of rows travel
    out = torch.empty((sum(received), *t.shape[1:]), dtype=t.dtype)
    return _Pending([], lambda: (out, torch.tensor(received, dtype=torch.int32)), key)


class _Alltoall(torch.autograd.Function):
    """Horovod's ``HorovodAlltoall``: backward sends each rank's gradient rows back where they
    came from (the reverse alltoall, with the received splits)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: Any, process_set: Any,
                comm: Any) -> Any:
        out, received = _alltoall_start(tensor, splits, name, process_set, comm).wait()
        ctx.args, ctx.received = (process_set, comm), received
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *unused: Any) -> tuple:
        process_set, comm = ctx.args
        back, _ = _alltoall_start(grad, ctx.received, None, process_set, comm).wait()
        return back, None, None, None, None


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet | None = None, *, comm: Any = None) -> int:
    """Start an alltoall of ``tensor``'s rows (see the module); a handle, done at once
    (``synchronize`` returns ``(tensor, received_splits)``)."""
    return _handle(_alltoall_start(tensor, splits, name, process_set, comm))


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet | None = None, *, comm: Any = None) -> Any:
    """``splits[j]`` rows of ``tensor`` to rank ``j`` (equal parts without ``splits``); the
    rows received, in rank order, and with ``splits`` also the received splits; differentiable."""
    if tensor.requires_grad:
        return _Alltoall.apply(tensor, splits, name, process_set, comm)
    out, received = _alltoall_start(tensor, splits, name, process_set, comm).wait()
    return out if splits is None else (out, received)


def barrier(process_set: ProcessSet | None = None, *, comm: Any = None) -> None:
    """Wait until every rank of the set has called it (:func:`collectives.barrier`)."""
    ps = resolve(process_set, comm)
    negotiate(control_of(ps), "barrier", (), ())
    api.barrier(comm=comm_of(ps))


def join(device: int = -1, process_set: ProcessSet | None = None) -> int:
    """Horovod's ``hvd.join()``: this rank has no more work; until every rank of the set has
    joined it takes part in the others' allreduces with zeros (their allgathers, broadcasts and
    reducescatters raise :class:`HorovodInternalError`). Returns, on every rank, the rank (of
    the default communicator) that joined last (the highest, if several did at once).
    ``device`` is Horovod's (a GPU's index) and is not used."""
    ps = resolve(process_set)
    c = comm_of(ps)
    ranks = ps.ranks if ps.ranks is not None else list(range(c.size))
    return join_rounds(control_of(ps), ranks, _zeros(c))


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """``root_rank``'s ``obj`` (pickled) on every rank of the set."""
    ps = resolve(process_set)
    negotiate(control_of(ps), "object", (), ())
    root = root_rank if ps.ranks is None else ps.ranks.index(root_rank)
    return comm_of(ps).bcast(obj, root=root)


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet | None = None) -> list:
    """Every rank's ``obj`` (pickled), in rank order."""
    ps = resolve(process_set)
    negotiate(control_of(ps), "object", (), ())
    return comm_of(ps).allgather(obj)
