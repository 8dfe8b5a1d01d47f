"""Horovod's collectives on tensors (``horovod.torch.mpi_ops``): allreduce, allgather, broadcast,
reducescatter, alltoall, their grouped and asynchronous forms, handles, ``barrier``, ``join`` and
object collectives.

Every call runs over a process set (:mod:`.process_sets`; default: every rank) as an operation of
the named stream of the set's communicator (:mod:`collectives.engine.named`, Horovod's
coordinator): submitted under its ``name``, or without one under the next automatic name of the
set (``noname.0``, ``noname.1`` ...: unnamed calls match in submission order), it returns at
once; a background thread negotiates (:mod:`.negotiation`: every rank submitted the same thing,
else :class:`~.negotiation.HorovodInternalError` on every rank) and runs the library's collective
(``allreduce``, ``allgather`` with ``counts``, ``bcast``, ``reduce_scatter``, ``alltoall``) once
every rank has submitted the name; named calls may be submitted in different orders on different
ranks (they run in rank 0's). A *finish* step (scaling, reshaping, copying back) runs when the
call is waited for. The ``*_async`` forms return a handle (an int): :func:`poll` says whether it
is done, :func:`synchronize` waits and returns the result; the others are
``synchronize(..._async(...))``.

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
- a ``name`` may be pending once per process set on a rank: a second call with a name not yet
  run raises ``ValueError`` at once, before any message (the name is free again once its
  operation has run, synchronized or not).
- ``synchronize`` raises :class:`HorovodInternalError` for a disagreement or a failure, and the
  ``ValueError``/``TypeError`` of an argument error (one rank's, raised on every rank).
- Sum/Average allreduce, allgather, broadcast and reducescatter (and their grouped forms, not
  the async ones) are autograd functions: backward is the same allreduce of the gradients;
  average then this rank's slice (allgather); average, kept on the root, zero elsewhere
  (broadcast); allgather, times ``p`` for Sum (reducescatter).

``compression=`` / ``codec=`` on :func:`allreduce` (not Compression.none) takes the compressed
path of :func:`collectives.torch.functions.compressed_allreduce_`, which does not negotiate.
``barrier`` and the object collectives are blocking, with a blocking negotiation on the set's
control communicator (:func:`~.negotiation.negotiate`).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import torch

from .. import api
from .._runtime.arrays import check_input
from .._runtime.guard import RaisedEverywhere
from .._runtime.validate import setup
from ..api import AllgatherCall, AllreduceCall, AlltoallCall, BcastCall, ReduceScatterCall
from ..engine import calls
from ._common import codec_of
from .basics import Adasum, default_comm
from .functions import compressed_allreduce_
from .negotiation import KINDS, STANDS_IN, HorovodInternalError, agree, negotiate
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
class _Op:
    """A Horovod operation as the named stream runs it: its signature (:mod:`.negotiation`) and
    ``body(ctx, sigs)``, which moves the data once every rank agrees (``sigs``: every rank's
    signature, None for a joined rank standing in; ``ctx`` None on one process)."""

    __slots__ = ("sig", "body", "sigs", "result", "trivial")

    def __init__(self, kind: str, tensors: Sequence[tuple], params: tuple,
                 body: Callable[[Any, Any], None]) -> None:
        self.sig, self.body = (kind, tuple(tensors), tuple(params)), body
        self.sigs: list | None = None
        self.result, self.trivial = None, False

    def signature(self) -> dict[str, Any]:
        kind, tensors, params = self.sig
        return {"op": kind, "tensors": tensors, "params": params}

    #: the named stream's agreement rule for these signatures (a function, sent by reference)
    agree = staticmethod(agree)

    def agreed(self, sigs: list) -> None:
        self.sigs = [None if s is None else _sig(s) for s in sigs]

    def run(self, ctx: Any) -> None:
        self.body(ctx, self.sigs)


class _Pending:
    """An operation in flight: its request, and what turns its buffers into the result."""

    __slots__ = ("request", "finish", "call")

    def __init__(self, request: Any, finish: Callable[[], Any], call: Any = None) -> None:
        self.request, self.finish, self.call = request, finish, call

    def test(self) -> bool:
        return self.request is None or self.request.test()

    def wait(self) -> Any:
        if self.request is not None:
            self.request.wait()
        return self.finish()


_HANDLES: dict[int, _Pending] = {}
_NEXT = itertools.count(1)


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
    return _wait(pending)


def _wait(pending: _Pending) -> Any:
    """``pending``'s result; argument errors (every rank raises them) as they are, any other
    failure as :class:`HorovodInternalError`, as Horovod raises it."""
    try:
        return pending.wait()
    except HorovodInternalError:
        raise
    except (TypeError, ValueError) as exc:
        if isinstance(exc, RaisedEverywhere):
            raise
        raise HorovodInternalError(f"{type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # an engine failure: Horovod raises its internal error
        raise HorovodInternalError(f"{type(exc).__name__}: {exc}") from exc


def _start(kind: str, tensors: Sequence[torch.Tensor], params: tuple,
           body: Callable[[Any, Any], None], name: str | None, comm: Any,
           finish: Callable[[], Any], error: Exception | None = None) -> _Pending:
    """Submit the Horovod operation ``kind`` on ``tensors`` to the named stream of ``comm``
    under ``name`` (or the stream's next automatic name); returns at once. ``error``: this rank's
    argument error, raised on every rank by the wait."""
    call = None if error is not None else _Op(kind, [_meta(t) for t in tensors], params, body)
    request = calls.submit(KINDS[kind], call, comm, None if name is None else str(name),
                           error=error)
    return _Pending(request, finish, call)


def _sig(sig: dict) -> tuple:
    """A signature as the named stream carries it, as :mod:`.negotiation` reads it."""
    return sig["op"], sig["tensors"], sig["params"]


def _checked(make: Callable[[], Any]) -> tuple[Any, Exception | None]:
    """``make()``, or its argument error (to be raised on every rank)."""
    try:
        return make(), None
    except (TypeError, ValueError) as exc:
        return None, exc


def _options(comm: Any) -> Any:
    return setup(comm, None, False)[1]


def _first(pending: _Pending) -> _Pending:
    """``pending`` returning the first of its results (a single tensor's call)."""
    return _Pending(pending.request, lambda: pending.finish()[0], pending.call)


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
    c = comm_of(resolve(process_set, comm))
    bufs = [_buffer(t, not inplace) for t in tensors]
    opts = _options(c)
    calls, error = _checked(lambda: [_allreduce_call(b, op, c, opts) for b in bufs])
    if error is None:
        for b in bufs:
            _scale(b, prescale)
    post = postscale / c.size if op == "avg" else postscale

    def finish() -> Any:
        for b in bufs:
            _scale(b, post)
        if inplace:
            _write_back(list(tensors), bufs)
            return list(tensors)
        return bufs

    return _start("allreduce", tensors, (op, float(prescale), float(postscale)),
                  lambda ctx, sigs: _run_all(calls, ctx), name, c, finish, error)


def _allreduce_call(buf: torch.Tensor, op: str, comm: Any, opts: Any) -> AllreduceCall:
    """The library's allreduce of ``buf`` in place (Average: the sum, scaled by the finish)."""
    return AllreduceCall(comm, buf, buf, "sum" if op == "avg" else op, "auto", opts)


def _run_all(calls: list, ctx: Any) -> None:
    for call in calls:
        call.run(ctx)


def _stand_in(kind: str, sig: dict) -> _Op:
    """What a joined rank runs in the others' allreduce (named.py): a reduction of zeros of
    their shapes, with their op."""
    _, tensors, params = _sig(sig)
    bufs = [torch.zeros(shape, dtype=getattr(torch, dtype)) for shape, dtype in tensors]

    def body(ctx: Any, sigs: Any) -> None:
        opts = _options(ctx.comm)
        _run_all([_allreduce_call(b, params[0], ctx.comm, opts) for b in bufs], ctx)

    return _Op("allreduce", tensors, params, body)


class _GroupedAllreduce(torch.autograd.Function):
    """Sum or average of every rank's tensors, differentiable: backward is the same reduction
    of the outputs' gradients (Horovod's ``HorovodAllreduce``/``HorovodGroupedAllreduce``)."""

    @staticmethod
    def forward(ctx: Any, args: tuple, *tensors: torch.Tensor) -> tuple:
        ctx.args = args
        return tuple(_wait(_allreduce_start(tensors, False, None, None, *args)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        return (None, *_wait(_allreduce_start(grads, False, None, None, *ctx.args)))


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
    return _handle(_first(pending))


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
    c = comm_of(resolve(process_set, comm))
    tensors = [t.detach().reshape(1) if t.dim() == 0 else t.detach() for t in tensors]
    srcs = [t.contiguous().view(-1) for t in tensors]
    opts = _options(c)
    _, error = _checked(lambda: [check_input(x) for x in srcs])
    outs: list[torch.Tensor] = []
    firsts_of: list[list[int]] = []  # every rank's first dimension, per tensor

    def body(ctx: Any, sigs: list) -> None:
        for i, (t, src) in enumerate(zip(tensors, srcs)):
            firsts = [s[1][i][0][0] for s in sigs]
            row = t[0].numel() if t.shape[0] else int(torch.Size(t.shape[1:]).numel())
            out = torch.empty((sum(firsts), *t.shape[1:]), dtype=t.dtype, device=t.device)
            AllgatherCall(c, src, out.view(-1), [f * row for f in firsts], "ring",
                          opts).run(ctx)
            outs.append(out)
            firsts_of.append(firsts)

    pending = _start("allgather", tensors, (), body, name, c, lambda: outs, error)
    pending.call = firsts_of
    return pending


class _GroupedAllgather(torch.autograd.Function):
    """Concatenation along the first dimension, differentiable: backward averages the outputs'
    gradients over the ranks and keeps this rank's rows (Horovod's ``HorovodAllgather``)."""

    @staticmethod
    def forward(ctx: Any, args: tuple, *tensors: torch.Tensor) -> tuple:
        ctx.args = args
        process_set, comm = args
        pending = _allgather_start(tensors, None, process_set, comm)
        out = tuple(_wait(pending))
        ctx.firsts, ctx.scalar = pending.call, [t.dim() == 0 for t in tensors]
        ctx.rank = comm_of(resolve(process_set, comm)).rank
        return out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        process_set, comm = ctx.args
        reduced = _wait(_allreduce_start(grads, False, None, None, "avg", 1.0, 1.0,
                                         process_set, comm))
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
    return _handle(_first(_allgather_start([tensor], name, process_set, comm)))


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet | None = None, *, comm: Any = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order (the first
    dimension may differ from rank to rank, the others not); differentiable."""
    return grouped_allgather([tensor], name, process_set, comm=comm)[0]


# ---------------------------------------------------------------------------- broadcast
def _broadcast_start(tensor: torch.Tensor, root_rank: int, inplace: bool, name: str | None,
                     process_set: ProcessSet | None, comm: Any) -> _Pending:
    ps = resolve(process_set, comm)
    ranks = ps.ranks
    if ranks is not None and root_rank not in ranks:
        raise HorovodInternalError(f"root_rank {root_rank} is not in the process set "
                                   f"(ranks {ranks})")
    c = comm_of(ps)
    root = int(root_rank) if ranks is None else ranks.index(root_rank)
    if not 0 <= root < c.size:
        raise HorovodInternalError(f"root_rank {root_rank} is not a rank of the process set "
                                   f"(size {c.size})")
    buf = _buffer(tensor, not inplace)
    call, error = _checked(lambda: BcastCall(c, buf, root, "binomial", _options(c)))

    def finish() -> torch.Tensor:
        if inplace:
            _write_back([tensor], [buf])
            return tensor
        return buf

    return _start("broadcast", [tensor], (int(root_rank),), lambda ctx, sigs: call.run(ctx),
                  name, c, finish, error)


class _Broadcast(torch.autograd.Function):
    """The root's tensor on every rank, differentiable: backward averages the gradients over the
    ranks and keeps them on the root, zeros elsewhere (Horovod's ``HorovodBroadcast``)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, process_set: Any,
                comm: Any) -> torch.Tensor:
        ctx.args = (root_rank, process_set, comm)
        return _wait(_broadcast_start(tensor, root_rank, False, None, process_set, comm))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        root_rank, process_set, comm = ctx.args
        g = _wait(_allreduce_start([grad], False, None, None, "avg", 1.0, 1.0, process_set,
                                   comm))[0]
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
    c = comm_of(resolve(process_set, comm))
    p, me = c.size, c.rank
    opts = _options(c)
    bufs, outs, counts = [], [], []
    for t in tensors:
        buf = _buffer(t, True)
        d0 = t.shape[0]
        rows = [d0 // p + (1 if r < d0 % p else 0) for r in range(p)]
        row = int(torch.Size(t.shape[1:]).numel())
        bufs.append(buf)
        outs.append(torch.empty((rows[me], *t.shape[1:]), dtype=t.dtype, device=t.device))
        counts.append([n * row for n in rows])
    calls, error = _checked(lambda: [
        ReduceScatterCall(c, b.view(-1), o.view(-1), "sum", n, "ring", opts)
        for b, o, n in zip(bufs, outs, counts)])
    if error is None:
        for b in bufs:
            _scale(b, prescale)
    post = postscale / p if op == "avg" else postscale

    def finish() -> list:
        for o in outs:
            _scale(o, post)
        return outs

    return _start("reducescatter", tensors, (op, float(prescale), float(postscale)),
                  lambda ctx, sigs: _run_all(calls, ctx), name, c, finish, error)


class _GroupedReducescatter(torch.autograd.Function):
    """Reduce-scatter along the first dimension, differentiable: backward gathers the outputs'
    gradients, times the set's size for Sum (Horovod's ``HorovodReducescatter``)."""

    @staticmethod
    def forward(ctx: Any, args: tuple, *tensors: torch.Tensor) -> tuple:
        ctx.args = args
        return tuple(_wait(_reducescatter_start(tensors, None, *args)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        op, _, _, process_set, comm = ctx.args
        gathered = _wait(_allgather_start(grads, None, process_set, comm))
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
    return _handle(_first(_reducescatter_start([tensor], name, op, prescale_factor,
                                               postscale_factor, process_set, comm)))


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
    c = comm_of(resolve(process_set, comm))
    t = tensor.detach()
    t = t.reshape(1) if t.dim() == 0 else t
    rows, problem = _rows_to_send(t, splits, c.size)
    row = int(torch.Size(t.shape[1:]).numel())
    done: list = []
    call, error = None, None if problem is None else ValueError(problem)
    if error is None and row:
        src = t[:sum(rows)].contiguous().view(-1)
        call, error = _checked(lambda: AlltoallCall(c, src, None, [r * row for r in rows],
                                                    "auto", _options(c)))

    def body(ctx: Any, sigs: Any) -> None:
        if call is not None:
            call.run(ctx)
            flat, got = call.result
            received = [g // row for g in got]
            done.append(torch.as_tensor(flat).view(sum(received), *t.shape[1:]))
        else:  # rows of no elements: only the counts of rows travel
            received = rows if ctx is None else ctx.comm.alltoall(rows)
            done.append(torch.empty((sum(received), *t.shape[1:]), dtype=t.dtype))
        done.append(torch.tensor(received, dtype=torch.int32))

    return _start("alltoall", [t], (), body, name, c, lambda: tuple(done), error)


class _Alltoall(torch.autograd.Function):
    """Horovod's ``HorovodAlltoall``: backward sends each rank's gradient rows back where they
    came from (the reverse alltoall, with the received splits)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: Any, process_set: Any,
                comm: Any) -> Any:
        out, received = _wait(_alltoall_start(tensor, splits, name, process_set, comm))
        ctx.args, ctx.received = (process_set, comm), received
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *unused: Any) -> tuple:
        process_set, comm = ctx.args
        back, _ = _wait(_alltoall_start(grad, ctx.received, None, process_set, comm))
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
    out, received = _wait(_alltoall_start(tensor, splits, name, process_set, comm))
    return out if splits is None else (out, received)


def barrier(process_set: ProcessSet | None = None, *, comm: Any = None) -> None:
    """Wait until every rank of the set has called it (:func:`collectives.barrier`)."""
    ps = resolve(process_set, comm)
    negotiate(control_of(ps), "barrier", (), ())
    api.barrier(comm=comm_of(ps))


def join(device: int = -1, process_set: ProcessSet | None = None) -> int:
    """Horovod's ``hvd.join()``: this rank has no more work; until every rank of the set has
    joined it takes part in the others' allreduces with zeros (their allgathers, broadcasts,
    alltoalls and reducescatters raise :class:`HorovodInternalError`): the named stream's join
    (:func:`collectives.engine.calls.join`). Returns, on every rank, the rank (of the default
    communicator) that joined last (the highest, if several did at once). The set's automatic
    names start again from ``noname.0``. ``device`` is Horovod's (a GPU's index) and is not
    used."""
    ps = resolve(process_set)
    c = comm_of(ps)
    ranks = ps.ranks if ps.ranks is not None else list(range(c.size))
    return ranks[calls.join(c, _stand_in, STANDS_IN).wait()]


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
