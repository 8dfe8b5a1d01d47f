"""The public collectives: check arguments, handle trivial cases, dispatch by name.

Conventions shared by every function here (those of ``MPI_Allreduce`` and mpi4py):

- ``x`` is a contiguous array of a dtype in :data:`SUPPORTED_DTYPES` or bfloat16: NumPy, CuPy, a
  PyTorch tensor (CPU or CUDA) or another ``__dlpack__`` exporter, or a buffer, used zero-copy
  (``_runtime/arrays.py``). Results keep its dtype; ``out=None`` returns a new array of the input's
  type (a tensor for a tensor), ``out=`` may be any of those kinds and is what is returned;
  ``out=x`` (or another object viewing exactly ``x``'s memory) works in place where the shapes
  allow.
- ``comm=None`` means ``MPI.COMM_WORLD``; any intracommunicator works. Messages travel on a
  private duplicate of ``comm``, so they never mix with the caller's.
- ``op`` is "sum", "prod", "min", "max" or "avg" (floats only), or ``MPI.SUM``-style objects.
- Bad arguments raise ``TypeError``/``ValueError`` before any message is sent. ``validate=True``
  (default: ``COLLECTIVES_VALIDATE``) also cross-checks the arguments no rank can see alone.
- Every rank ends with bitwise identical results.

Each collective is a small *call* class (``AllreduceCall`` ...): its constructor checks the
arguments and fixes everything a run needs (flat views, the op, the algorithm, block offsets, the
result array); ``run(ctx)`` communicates on ``ctx.comm``. The blocking functions here build one
and run it at once; the non-blocking ones (:mod:`collectives.engine.nonblocking`) hand it to the
communicator's progress engine, and persistent plans keep one and run it at every ``start()``;
so all three check the same way and compute the same bits.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from compress.arrays import same_memory
from mpi4py import MPI

from ._runtime.arrays import (check_input, check_out, copy_into, flat, in_block, new_like,
                              own_block, returned, writeable)
from ._runtime.workspace import scratch
from ._runtime.blocking import run_call
from ._runtime.context import context
from ._runtime.abort_mode import runner
from ._runtime.flight import describe
from ._runtime.guard import mark_argument_error
from ._runtime.counts import block_offsets as _offsets, gathered_offsets as _gathered
from ._runtime.repeats import NO_ARRAYS, REPEATS, Kind, Repeat, kind_of
from ._runtime.validate import lookup
from .algorithms import (ALGORITHMS, ALLTOALL, ALLTOALL_RESOLVERS, ALLTOALLV_SETUP, BARRIER,
                         BARRIER_RESOLVERS, EQUAL_BLOCKS_ONLY, FLAT, auto, lanes)
from .blocks import ALLGATHER, BCAST, GATHER, REDUCE, REDUCE_SCATTER, SCATTER
from .blocks.bruck import alltoall as _bruck
from .ops import Op, get_op
from .options import Options
from ._runtime.context import Context

__all__ = ["allreduce", "reduce_scatter", "allgather", "bcast", "reduce", "alltoall", "barrier",
           "gather", "scatter", "AllreduceCall", "ReduceScatterCall", "AllgatherCall",
           "BcastCall", "ReduceCall", "AlltoallCall", "BarrierCall", "GatherCall",
           "ScatterCall", "run_allreduce"]

OpLike = str | MPI.Op | Op
#: the one cache's lookup, bound once (every repeat of a training loop calls it)
_find = REPEATS.find


def _check_root(root: object, comm: MPI.Comm) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= root < comm.size:
        raise ValueError(f"root must be a rank in 0..{comm.size - 1}, got {root!r}")
    return int(root)


def _finish_avg(op: Op, result: np.ndarray, p: int) -> None:
    if op.average and p > 1:
        op.divide(result, p)


class AllreduceCall:
    """A checked allreduce: ``run(ctx)`` reduces ``src`` into ``dst`` on ``ctx.comm``."""

    kind = "allreduce"
    __slots__ = ("src", "dst", "op", "fn", "algorithm", "opts", "result", "trivial")

    def __init__(self, comm: MPI.Comm, x: np.ndarray, out: np.ndarray | None, op: OpLike,
                 algorithm: str, opts: Options) -> None:
        a = check_input(x)
        self.op = get_op(op, a.dtype)
        self.fn = lookup(ALGORITHMS, algorithm, "algorithm")
        if opts.inter_algorithm not in FLAT:
            lookup(FLAT, opts.inter_algorithm, "inter_algorithm")
        res = new_like(a) if out is None else check_out(out, a)
        self.src = flat(a)
        self.dst = self.src if res is a else flat(res)
        self.algorithm, self.opts, self.result = algorithm, opts, returned(x, out, res)
        self.trivial = a.size == 0 or comm.size == 1

    def signature(self) -> dict[str, Any]:
        return {"count": self.src.size, "dtype": self.src.dtype, "op": self.op.name,
                "algorithm": self.algorithm}

    def run(self, ctx: Context) -> None:
        if self.trivial:  # trivial cases, here only
            copy_into(self.src, self.dst)
            return
        run_allreduce(self.src, self.dst, self.op, self.decide(ctx), ctx, self.opts)

    def decide(self, ctx: Context) -> Any:
        """The algorithm function of this and every later run: "auto" resolved for this size on
        ``ctx`` at the first run (collective the first time on a communicator), then kept, so a
        persistent plan or a repeated call decides once. Returns the function."""
        if self.fn is _AUTO:
            self.fn = auto.resolve(self.dst, ctx, self.opts)
        return self.fn


_AUTO = ALGORITHMS["auto"]


def run_allreduce(src: np.ndarray, dst: np.ndarray, op: Op, fn: Any, ctx: Context,
                  opts: Options) -> None:
    """Reduce ``src`` into ``dst`` with the algorithm function ``fn`` on ``ctx``: the run of a
    checked allreduce, blocking or the engine's (a repeated call, a plan's ``plan()`` and a
    remembered ``iallreduce`` run what ``algorithms.lanes.lane`` made, the same work)."""
    fn(src, dst, op, ctx, opts)
    if op.average:
        _finish_avg(op, dst, ctx.comm.size)


class _Repeat(Repeat):
    """A remembered blocking allreduce (``_runtime/repeats.py``): its repeat runs the decided
    algorithm, as its lane if it has one (every repeat passes arrays of this call's types), the
    division of "avg" included, under the runner of its options (the guard, or abort mode's),
    on the context ``where``."""

    __slots__ = ("run", "fn", "reduction", "what")

    def __init__(self, call: AllreduceCall, x: Any, out: Any, op: str, algorithm: str,
                 comm_arg: Any, options: Any, ctx: Context, xkind: Kind, okind: Kind) -> None:
        super().__init__("allreduce", call, x, out, op, algorithm, comm_arg, options, ctx,
                         xkind, okind)
        self.run, self.reduction = runner(ctx, call.opts).run, call.op
        src = call.src if self.src is None else self.src
        dst = src if self.inplace else (call.dst if self.dst is None else self.dst)
        self.fn = lanes.lane(call.decide(ctx), src, dst, call.op, ctx, call.opts)
        self.what = describe(call)  # for the flight recorder, made once (_runtime/flight.py)


class ReduceScatterCall:
    """A checked reduce-scatter: ``run(ctx)`` leaves block ``rank`` in ``result``."""

    kind = "reduce_scatter"
    __slots__ = ("src", "dst", "op", "fn", "offsets", "algorithm", "opts", "result", "trivial")

    def __init__(self, comm: MPI.Comm, x: np.ndarray, out: np.ndarray | None, op: OpLike,
                 counts: Sequence[int] | None, algorithm: str, opts: Options) -> None:
        a = check_input(x)
        self.op = get_op(op, a.dtype)
        self.fn = lookup(REDUCE_SCATTER, algorithm, "algorithm")
        self.offsets = offsets = _offsets(counts, a.size, comm.size)
        lo, hi = int(offsets[comm.rank]), int(offsets[comm.rank + 1])
        res = own_block(out, flat(a), lo, hi)  # in place: out is x's own block
        if res is None:
            res = new_like(a, (hi - lo,)) if out is None else check_out(out, a, (hi - lo,))
        self.src, self.dst, self.algorithm, self.opts = flat(a), flat(res), algorithm, opts
        self.result = returned(x, out, res)
        self.trivial = a.size == 0 or comm.size == 1

    def signature(self) -> dict[str, Any]:
        return {"count": self.src.size, "dtype": self.src.dtype, "op": self.op.name,
                "algorithm": self.algorithm, "counts": tuple(np.diff(self.offsets).tolist())}

    def run(self, ctx: Context) -> None:
        if self.trivial:
            copy_into(self.src, self.dst)
            return
        self.fn(self.src, self.dst, self.offsets, self.op, ctx, self.opts)
        _finish_avg(self.op, self.dst, ctx.comm.size)


class AllgatherCall:
    """A checked allgather: ``run(ctx)`` concatenates every rank's block into ``result``."""

    kind = "allgather"
    __slots__ = ("src", "dst", "fn", "offsets", "algorithm", "opts", "result", "trivial")

    def __init__(self, comm: MPI.Comm, x: np.ndarray, out: np.ndarray | None,
                 counts: Sequence[int] | None, algorithm: str, opts: Options) -> None:
        a = check_input(x)
        self.fn = lookup(ALLGATHER, algorithm, "algorithm")
        self.offsets, total = offsets, total = _gathered(comm, a, counts)
        res = None if out is None else in_block(out, flat(a), int(offsets[comm.rank]), total)
        if res is None:  # (else in place: x is out's own block)
            res = new_like(a, (total,)) if out is None else check_out(out, a, (total,))
        self.src, self.dst, self.algorithm, self.opts = flat(a), flat(res), algorithm, opts
        self.result = returned(x, out, res)
        self.trivial = total == 0 or comm.size == 1

    def signature(self) -> dict[str, Any]:
        return {"dtype": self.src.dtype, "algorithm": self.algorithm,
                "counts": tuple(np.diff(self.offsets).tolist())}

    def run(self, ctx: Context) -> None:
        if self.trivial:
            copy_into(self.src, self.dst)
            return
        self.fn(self.src, self.dst, self.offsets, ctx, self.opts)


class BcastCall:
    """A checked broadcast: ``run(ctx)`` copies ``root``'s ``x`` into every rank's ``x``."""

    kind = "bcast"
    __slots__ = ("buf", "root", "fn", "algorithm", "opts", "result", "trivial")

    def __init__(self, comm: MPI.Comm, x: np.ndarray, root: int, algorithm: str,
                 opts: Options) -> None:
        a = check_input(x)
        self.root = _check_root(root, comm)
        self.fn = lookup(BCAST, algorithm, "algorithm")
        if not writeable(a):
            raise ValueError("x is read-only; bcast writes into it on every rank but the root")
        self.buf, self.algorithm, self.opts = flat(a), algorithm, opts
        self.result = returned(x, x, a)
        self.trivial = a.size == 0 or comm.size == 1

    def signature(self) -> dict[str, Any]:
        return {"count": self.buf.size, "dtype": self.buf.dtype, "root": self.root,
                "algorithm": self.algorithm}

    def run(self, ctx: Context) -> None:
        if not self.trivial:
            self.fn(self.buf, self.root, ctx, self.opts)


class ReduceCall:
    """A checked reduce: ``run(ctx)`` leaves the reduction in ``result`` on ``root``."""

    kind = "reduce"
    __slots__ = ("src", "dst", "op", "root", "fn", "algorithm", "opts", "result", "trivial")

    def __init__(self, comm: MPI.Comm, x: np.ndarray, out: np.ndarray | None, op: OpLike,
                 root: int, algorithm: str, opts: Options) -> None:
        a = check_input(x)
        self.op = get_op(op, a.dtype)
        self.root = r = _check_root(root, comm)
        self.fn = lookup(REDUCE, algorithm, "algorithm")
        res = None
        if comm.rank == r:
            res = new_like(a) if out is None else check_out(out, a)
        self.src = src = flat(a)
        self.dst = None if res is None else (src if res is a else flat(res))
        self.algorithm, self.opts, self.result = algorithm, opts, returned(x, out, res)
        self.trivial = a.size == 0 or comm.size == 1

    def signature(self) -> dict[str, Any]:
        return {"count": self.src.size, "dtype": self.src.dtype, "op": self.op.name,
                "root": self.root, "algorithm": self.algorithm}

    def run(self, ctx: Context) -> None:
        if self.trivial:
            if self.dst is not None:
                copy_into(self.src, self.dst)
            return
        self.fn(self.src, self.dst, self.op, self.root, ctx, self.opts)
        if self.dst is not None:
            _finish_avg(self.op, self.dst, ctx.comm.size)


def _out_block(out: object, n: int) -> np.ndarray:
    """A caller's result array for ``n`` elements, where no input says its dtype: 1-D, writeable."""
    o = check_input(out, "out")
    if o.shape != (n,):
        raise ValueError(f"out has shape {o.shape}, expected {(n,)}")
    if not writeable(o):
        raise ValueError("out is read-only")
    return o


class AlltoallCall:
    """A checked alltoall: ``run(ctx)`` sends block ``j`` of ``x`` to rank ``j`` and puts the
    block from rank ``i`` at block ``i`` of ``result``. With ``counts`` (the v form) the receive
    counts are learned first (``out_counts``), and ``result`` is ``(array, out_counts)``."""

    kind = "alltoall"
    __slots__ = ("x", "out", "src", "dst", "a", "fn", "sendoffsets", "recvoffsets", "algorithm",
                 "opts", "result", "trivial", "out_counts", "inplace", "exchange")

    def __init__(self, comm: MPI.Comm, x: np.ndarray, out: np.ndarray | None,
                 counts: Sequence[int] | None, algorithm: str, opts: Options) -> None:
        a = check_input(x)
        p = comm.size
        self.fn = lookup(ALLTOALL, algorithm, "algorithm")
        self.x, self.out, self.a, self.algorithm, self.opts = x, out, a, algorithm, opts
        self.out_counts = self.exchange = None
        if counts is None:
            if a.size % p:
                raise ValueError(f"x has {a.size} elements, not a multiple of the {p} ranks; "
                                 f"pass counts= for blocks of different sizes")
            res = new_like(a) if out is None else check_out(out, a)
            self.sendoffsets = [k * (a.size // p) for k in range(p + 1)]
            self.recvoffsets = None  # the same blocks (blocks/__init__.py)
            self.src, self.dst = flat(a), flat(res)
            self.inplace = res is a  # the algorithms read a copy, made by run()
            self.result = returned(x, out, res)
            self.trivial = a.size == 0 or p == 1
        else:
            if algorithm in EQUAL_BLOCKS_ONLY:
                raise ValueError(f"algorithm {algorithm!r} needs equal blocks (no counts=); "
                                 f"valid with counts=: "
                                 f"{', '.join(n for n in ALLTOALL if n not in EQUAL_BLOCKS_ONLY)}")
            self.sendoffsets = _offsets(counts, a.size, p)
            if out is not None:
                o = check_input(out, "out")
                if o is a or same_memory(o, a):
                    raise ValueError("alltoall with counts= cannot work in place (the receive "
                                     "counts may differ from the send counts); pass another out")
                check_out(out, a, (o.size,))  # dtype, 1-D, writeable, no overlap
            self.src, self.dst, self.recvoffsets, self.result = flat(a), None, None, None
            self.inplace, self.trivial = False, p == 1

    def signature(self) -> dict[str, Any]:
        return {"count": self.src.size if self.dst is not None else "counts=",
                "dtype": self.a.dtype, "algorithm": self.algorithm}

    def run(self, ctx: Context | None) -> None:
        if self.dst is not None:  # equal blocks
            if self.trivial:
                copy_into(self.src, self.dst)
                return
            src = self.src
            if self.inplace:  # the copy in the running thread's scratch (an engine's run is
                src = scratch("alltoall.inplace", src.size, src)  # later than the call)
                copy_into(self.src, src)
            self.fn(src, self.dst, self.sendoffsets, None, ctx, self.opts)
            return
        # the v form: learn the receive counts (Horovod's received splits), then exchange
        sent = np.diff(np.asarray(self.sendoffsets, dtype=np.int64))
        if self.trivial:
            got = sent
        else:
            setup = ALLTOALLV_SETUP.get(self.fn)  # collective: before a rank may raise alone
            exchange = None if setup is None else setup(ctx, self.opts)  # (at out, below)
            if exchange is None:  # a Bruck alltoall of the counts; else the algorithm's own
                exchange = _counts_by_bruck(ctx)  # (shm: through the node's window)
            got = np.empty_like(sent)
            exchange(sent, got)
            self.exchange = exchange  # (a remembered call's repeats exchange the same way)
        self.out_counts, recvoffsets = _received(got)
        total = recvoffsets[-1]
        if self.out is None:
            res = new_like(self.a, (total,))
        else:
            res = check_out(self.out, self.a, (total,))
        self.dst = flat(res)
        if self.trivial:
            copy_into(self.src, self.dst)
        else:
            self.recvoffsets = recvoffsets
            self.fn(self.src, self.dst, self.sendoffsets, self.recvoffsets, ctx, self.opts)
        self.result = (returned(self.x, self.out, res), self.out_counts)


def _received(got: np.ndarray) -> tuple[list[int], list[int]]:
    """The v form's receive counts (one int64 per rank, as exchanged) as a list, and the
    ``p + 1`` offsets of the blocks they make in ``out`` (the last: their total)."""
    counts = got.tolist()
    offsets, total = [0], 0
    for count in counts:
        total += count
        offsets.append(total)
    return counts, offsets


def _counts_by_bruck(ctx: Context) -> Any:
    """The v form's exchange of the receive counts by messages: a Bruck alltoall of one int64
    per rank, ``(sent, got)``."""
    return lambda sent, got: _bruck(sent, got, 1, ctx.comm, ctx.active)


class BarrierCall:
    """A checked barrier: ``run(ctx)`` returns once every rank has entered."""

    kind = "barrier"
    __slots__ = ("fn", "algorithm", "opts", "result", "trivial")

    def __init__(self, comm: MPI.Comm, algorithm: str, opts: Options) -> None:
        self.fn = lookup(BARRIER, algorithm, "algorithm")
        self.algorithm, self.opts, self.result = algorithm, opts, None
        self.trivial = comm.size == 1

    def signature(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm}

    def run(self, ctx: Context | None) -> None:
        if not self.trivial:
            resolve = BARRIER_RESOLVERS.get(self.fn)  # "auto" and "shm": once per call object
            if resolve is not None:
                self.fn = resolve(ctx, self.opts)
            self.fn(ctx, self.opts)


class _AlltoallRepeat(Repeat):
    """A remembered blocking alltoall out of place (``_runtime/repeats.py``), under the runner of
    its options, on the context ``where``. Of equal blocks: its repeat runs the decided
    algorithm function ("auto" resolved for this block size and p) on the same block offsets.
    Of the v form (``counts=``, form "alltoallv"): the counts change from call to call (a
    mixture of experts' dispatch), so its repeat (:func:`_alltoallv_again`) checks them as the
    first call does, exchanges them the way the first call did (``exchange``, on the counts'
    arrays ``sent`` and ``got``), checks ``out``'s size against the received total, and runs the
    decided algorithm function ("auto" resolved; the shm alltoall as its lane of the v form)."""

    __slots__ = ("run", "fn", "offsets", "exchange", "sent", "got", "what")

    def __init__(self, call: AlltoallCall, x: Any, out: Any, algorithm: str, comm_arg: Any,
                 options: Any, ctx: Context, xkind: Kind, okind: Kind) -> None:
        v = call.exchange is not None  # (the v form's first call exchanged its counts)
        super().__init__("alltoallv" if v else "alltoall", call, x, out, _NO_OP, algorithm,
                         comm_arg, options, ctx, xkind, okind)
        self.run, self.offsets, self.exchange = runner(ctx, call.opts).run, call.sendoffsets, \
            call.exchange
        fn = call.fn
        resolve = ALLTOALL_RESOLVERS.get(fn)  # "auto" and "shm": the block size, p and the
        if resolve is not None:               # arrays' types are the repeat's too
            fn = resolve(call.src, call.dst, ctx, call.opts, v)
        self.fn = fn
        # the v form's counts, as its first call's (int64, one per rank): the exchange's lane
        # takes arrays of the same types at every call
        p = ctx.comm.size
        self.sent, self.got = (np.empty(p, np.int64), np.empty(p, np.int64)) if v else (None, None)
        self.what = describe(call)  # for the flight recorder, made once (_runtime/flight.py)


def _alltoallv_again(e: _AlltoallRepeat, src: Any, dst: Any, counts: Sequence[int],
                     ctx: Context) -> list[int]:
    """The body of a remembered v form's repeat (:class:`_AlltoallRepeat`), under the guard:
    ``counts`` checked, the receive counts exchanged, the blocks exchanged; returns the receive
    counts."""
    try:
        sendoffsets = _offsets(counts, src.size, ctx.comm.size)
    except Exception as exc:
        mark_argument_error(exc)
        raise
    sent, got = e.sent, e.got
    sent[:] = counts  # (checked: the offsets' differences)
    e.exchange(sent, got)
    out_counts, recvoffsets = _received(got)
    if recvoffsets[-1] != dst.size:  # the first call's error (check_out) for the same out
        check_out(dst, src, (recvoffsets[-1],))
    e.fn(src, dst, sendoffsets, recvoffsets, ctx, e.opts)
    return out_counts


class _BarrierRepeat(Repeat):
    """A remembered barrier: the one cache's entry (``_runtime/repeats.py``) of a call with no
    arrays (both stand-ins are :data:`_NO_ARRAY`), found by communicator, algorithm name and
    ``options=`` argument while the context lives; its repeat runs the algorithm function
    under the runner of its options."""

    __slots__ = ("run", "fn", "what")

    def __init__(self, call: BarrierCall, algorithm: str, comm_arg: Any, options: Any,
                 ctx: Context) -> None:
        super().__init__("barrier", _NoArrays(call.opts), _NO_ARRAY, _NO_ARRAY, _NO_OP,
                         algorithm, comm_arg, options, ctx, NO_ARRAYS, NO_ARRAYS)
        self.run, self.fn = runner(ctx, call.opts).run, call.fn
        self.what = describe(call)


class _NoArrays:
    """What :class:`Repeat` reads of a checked call, for a call with no arrays."""

    __slots__ = ("src", "dst", "opts")

    def __init__(self, opts: Options) -> None:
        self.src = self.dst = _NO_ARRAY
        self.opts = opts


#: the op name of the remembered calls that have none (a string: the keyed lookup's)
_NO_OP = ""
#: the stand-in array of a remembered call with no arrays (barrier)
_NO_ARRAY = np.empty(0, dtype=np.uint8)


class GatherCall:
    """A checked gather: ``run(ctx)`` concatenates every rank's block into ``result`` on
    ``root`` (None elsewhere)."""

    kind = "gather"
    __slots__ = ("src", "dst", "root", "fn", "offsets", "algorithm", "opts", "result", "trivial")

    def __init__(self, comm: MPI.Comm, x: np.ndarray, out: np.ndarray | None, root: int,
                 counts: Sequence[int] | None, algorithm: str, opts: Options) -> None:
        a = check_input(x)
        self.root = r = _check_root(root, comm)
        self.fn = lookup(GATHER, algorithm, "algorithm")
        self.offsets, total = _gathered(comm, a, counts)
        res = None
        if comm.rank == r:
            res = new_like(a, (total,)) if out is None else check_out(out, a, (total,))
        self.src, self.dst = flat(a), None if res is None else flat(res)
        self.algorithm, self.opts, self.result = algorithm, opts, returned(x, out, res)
        self.trivial = total == 0 or comm.size == 1

    def signature(self) -> dict[str, Any]:
        return {"dtype": self.src.dtype, "root": self.root, "algorithm": self.algorithm,
                "counts": tuple(np.diff(self.offsets).tolist())}

    def run(self, ctx: Context | None) -> None:
        if self.trivial:
            if self.dst is not None:
                copy_into(self.src, self.dst)
            return
        self.fn(self.src, self.dst, self.offsets, self.root, ctx, self.opts)


class ScatterCall:
    """A checked scatter: ``run(ctx)`` puts block ``rank`` of ``root``'s ``x`` into ``result``.
    Off the root ``x`` is not read: None with ``out=`` (which gives the block's dtype and size),
    or an array like the root's (its dtype and, without ``counts``, its size are used)."""

    kind = "scatter"
    __slots__ = ("src", "dst", "dtype", "root", "fn", "offsets", "algorithm", "opts", "result",
                 "trivial")

    def __init__(self, comm: MPI.Comm, x: np.ndarray | None, out: np.ndarray | None, root: int,
                 counts: Sequence[int] | None, algorithm: str, opts: Options) -> None:
        p, rank = comm.size, comm.rank
        self.root = r = _check_root(root, comm)
        self.fn = lookup(SCATTER, algorithm, "algorithm")
        if rank == r or x is not None:
            a = check_input(x)
            if counts is None:
                if a.size % p:
                    raise ValueError(f"x has {a.size} elements, not a multiple of the {p} "
                                     f"ranks; pass counts= for blocks of different sizes")
                counts = [a.size // p] * p
            total = a.size if rank == r else int(np.sum(counts))
            self.offsets = offsets = _offsets(counts, total, p)
            n = int(offsets[rank + 1] - offsets[rank])
            res = new_like(a, (n,)) if out is None else check_out(out, a, (n,))
            template = x
        elif out is None:
            raise ValueError("scatter: on a rank other than the root pass out= (an array of "
                             "the block's size and dtype) or x (an array like the root's)")
        else:
            res = check_input(out, "out")
            if counts is None:
                counts = [res.size] * p
            self.offsets = offsets = _offsets(counts, int(np.sum(counts)), p)
            res = _out_block(out, int(offsets[rank + 1] - offsets[rank]))
            template = out
        self.src = flat(a) if rank == r else None
        self.dst, self.dtype = flat(res), res.dtype
        self.algorithm, self.opts = algorithm, opts
        self.result = returned(template, out, res)
        self.trivial = int(offsets[-1]) == 0 or p == 1

    def signature(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "root": self.root, "algorithm": self.algorithm,
                "counts": tuple(np.diff(self.offsets).tolist())}

    def run(self, ctx: Context | None) -> None:
        if self.trivial:
            if self.src is not None:
                copy_into(self.src[self.offsets[self.root]:self.offsets[self.root + 1]],
                          self.dst)
            return
        self.fn(self.src, self.dst, self.offsets, self.root, ctx, self.opts)


def allreduce(x: np.ndarray, *, out: np.ndarray | None = None, op: OpLike = "sum",
              algorithm: str = "auto", comm: MPI.Comm | None = None,
              validate: bool | None = None, options: Options | None = None) -> np.ndarray:
    """Reduce ``x`` elementwise over all ranks of ``comm``; every rank gets the result.

    Parameters
    ----------
    x
        Contiguous array; the same shape and dtype on every rank.
    out
        Result array (``x``'s shape and dtype); ``out=x`` reduces in place. None: a new array.
    op
        "sum", "prod", "min", "max", "avg", or ``MPI.SUM``/``MPI.PROD``/``MPI.MIN``/``MPI.MAX``.
    algorithm
        A name in :data:`collectives.ALGORITHMS`.
    comm
        Intracommunicator (default ``MPI.COMM_WORLD``).
    validate
        Cross-check arguments across ranks first (default: ``Options.validate``).
    options
        Segment size, emulated node size, inter-node algorithm (default: from the environment,
        :meth:`Options.from_env`; a repeat keeps its first call's, see below).

    Returns
    -------
    numpy.ndarray
        ``out``, holding the reduction; bitwise identical on every rank.

    A call repeated with the same ``x``, ``out`` (given), ``comm``, op and algorithm names and
    ``options=`` argument, ``validate`` left unset, is *remembered* (``_runtime/repeats.py``,
    NumPy and CuPy arrays and PyTorch tensors): it skips the checks and decisions of its first
    call after re-checking what could have changed in place (shape, strides, dtype, data
    pointer of a tensor, the write flag, the communicator freed or reset). Made without
    ``options=``, it keeps the options its first call read from the environment.
    """
    # a repeat of a remembered call (_runtime/repeats.py): a training loop's every step
    e = _find("allreduce", x, out, op, algorithm, comm, options)
    if e is not None and validate is None:
        src, dst = (x, out) if e.vector else (e.pair or e.views(x, out))
        opts = e.opts
        e.run("allreduce", e.fn, src, dst, e.reduction, e.where, opts, timeout=opts.timeout,
              what=e.what)
        return out
    call = run_call(AllreduceCall, comm, options, validate, x, out, op, algorithm)
    if (validate is None and type(op) is str and out is not None and not call.trivial
            and not call.opts.validate):
        xkind, okind = kind_of(x), kind_of(out)
        if xkind is not None and okind is not None:
            ctx = context(MPI.COMM_WORLD if comm is None else comm)
            REPEATS.remember(_Repeat(call, x, out, op, algorithm, comm, options, ctx, xkind,
                                     okind))
    return call.result


def reduce_scatter(x: np.ndarray, *, out: np.ndarray | None = None, op: OpLike = "sum",
                   counts: Sequence[int] | None = None, algorithm: str = "ring",
                   comm: MPI.Comm | None = None, validate: bool | None = None,
                   options: Options | None = None) -> np.ndarray:
    """Reduce ``x`` over all ranks and give rank ``r`` block ``r`` of the result (1-D).

    ``counts[r]`` is the length of rank ``r``'s block (``MPI_Reduce_scatter``'s recvcounts); by
    default ``x.size`` is split into near-equal blocks, the first ``x.size % p`` one longer.
    ``algorithm``: "ring" or "native".

    In place (NCCL's layout, ``recvbuff == sendbuff + rank * recvcount``): ``out`` a 1-D view
    of exactly block ``rank`` of a contiguous ``x`` (``x.reshape(-1)[lo:hi]``); the result lands
    there without a copy of ``x``, and the rest of ``x`` is left holding partial results
    (undefined): the caller gives ``x`` up to the call, as the ring's work buffer.
    """
    return run_call(ReduceScatterCall, comm, options, validate, x, out, op, counts, algorithm).result


def allgather(x: np.ndarray, *, out: np.ndarray | None = None,
              counts: Sequence[int] | None = None, algorithm: str = "ring",
              comm: MPI.Comm | None = None, validate: bool | None = None,
              options: Options | None = None) -> np.ndarray:
    """Concatenate every rank's ``x`` (flattened), in rank order, on every rank (1-D result).

    Without ``counts`` every rank must pass the same number of elements (``MPI_Allgather``); with
    ``counts`` (one per rank, ``counts[rank] == x.size``) blocks may differ (``MPI_Allgatherv``).
    ``algorithm``: "ring" or "native".

    In place (``MPI_IN_PLACE``'s layout, and NCCL's): ``x`` a view of exactly block ``rank`` of
    a 1-D ``out`` (``out[lo:hi]``); it is not copied, the other blocks arrive around it.
    """
    return run_call(AllgatherCall, comm, options, validate, x, out, counts, algorithm).result


def bcast(x: np.ndarray, *, root: int = 0, algorithm: str = "binomial",
          comm: MPI.Comm | None = None, validate: bool | None = None,
          options: Options | None = None) -> np.ndarray:
    """Copy ``x`` of rank ``root`` into ``x`` of every rank, in place; returns ``x``.

    ``algorithm``: "binomial" (pipelined in segments) or "native".
    """
    return run_call(BcastCall, comm, options, validate, x, root, algorithm).result


def reduce(x: np.ndarray, *, out: np.ndarray | None = None, op: OpLike = "sum", root: int = 0,
           algorithm: str = "binomial", comm: MPI.Comm | None = None,
           validate: bool | None = None, options: Options | None = None) -> np.ndarray | None:
    """Reduce ``x`` over all ranks into ``out`` on ``root``.

    Returns the result on ``root`` (a new array when ``out`` is None; ``out=x`` works in place)
    and None on every other rank, where ``out`` is ignored. ``algorithm``: "binomial" or "native".
    """
    return run_call(ReduceCall, comm, options, validate, x, out, op, root, algorithm).result


def alltoall(x: np.ndarray, *, out: np.ndarray | None = None,
             counts: Sequence[int] | None = None, algorithm: str = "auto",
             comm: MPI.Comm | None = None, validate: bool | None = None,
             options: Options | None = None) -> Any:
    """Exchange blocks between all ranks: block ``j`` of this rank's ``x`` (flattened) becomes
    block ``rank`` of rank ``j``'s result (``MPI_Alltoall``).

    Without ``counts``, ``x.size`` must be a multiple of p, every rank passes the same size, and
    the result has ``x``'s shape (for a C-ordered array whose first axis is a multiple of p the
    blocks are slices along that axis, as in ``torch.distributed.all_to_all_single``);
    ``out=x`` works in place.

    With ``counts`` (the v form, ``MPI_Alltoallv``) ``counts[j]`` is how many elements of ``x``
    go to rank ``j``: Horovod's ``splits``, the send splits. The receive counts are learned from
    the other ranks (one small exchange first) and returned: the result is
    ``(y, out_counts)``, ``y`` 1-D with the block from rank ``i`` at
    ``sum(out_counts[:i])``, and ``out_counts`` a list of p ints, as Horovod returns its
    ``received_splits``. ``out=`` must then be 1-D of ``sum(out_counts)`` elements (checked once
    they are known); in place is not possible.

    ``algorithm``: "auto" ("shm" on one node, else the fitted cost model's fastest for the
    block size: ``blocks/auto.py``, and pairwise for the v form), "shm" (one node, equal blocks
    or the v form: each rank copies its blocks straight from the others' memory,
    ``algorithms/shm_alltoall.py``), "pairwise", "bruck" (equal blocks only), "hierarchical" or
    "native" (:data:`collectives.ALLTOALL`).

    A call out of place repeated with the same ``x``, ``out`` (given), ``comm``, algorithm name
    and ``options=`` argument, ``validate`` left unset, is remembered as :func:`allreduce`'s is
    (``_runtime/repeats.py``): it skips its first call's checks and decisions after re-checking
    what could have changed in place, and keeps the options its first call read from the
    environment. In the v form the counts may change from call to call: a repeat checks them,
    exchanges them and checks ``out``'s size against the received total as a first call does.
    """
    if validate is None:  # a repeat (_runtime/repeats.py)
        e = _find("alltoall" if counts is None else "alltoallv", x, out, _NO_OP, algorithm, comm,
                  options)
        if e is not None:
            src, dst = (x, out) if e.vector else (e.pair or e.views(x, out))
            opts = e.opts
            if counts is None:
                e.run("alltoall", e.fn, src, dst, e.offsets, None, e.where, opts,
                      timeout=opts.timeout, what=e.what)
                return out
            return out, e.run("alltoall", _alltoallv_again, e, src, dst, counts, e.where,
                              timeout=opts.timeout, what=e.what)
    call = run_call(AlltoallCall, comm, options, validate, x, out, counts, algorithm)
    if (validate is None and out is not None and not call.trivial and not call.inplace
            and not call.opts.validate):
        xkind, okind = kind_of(x), kind_of(out)
        if xkind is not None and okind is not None:
            ctx = context(MPI.COMM_WORLD if comm is None else comm)
            REPEATS.remember(_AlltoallRepeat(call, x, out, algorithm, comm, options, ctx, xkind,
                                             okind))
    return call.result


def barrier(*, algorithm: str = "auto", comm: MPI.Comm | None = None,
            options: Options | None = None) -> None:
    """Return once every rank of ``comm`` has called ``barrier`` (``MPI_Barrier``).

    ``algorithm``: "auto" ("shm" when every rank shares one node: no message, the ranks'
    counters in a shared window; else "dissemination": ceil(log2 p) rounds of empty messages),
    "shm", "dissemination" or "native" (:data:`collectives.BARRIER`). A failure on any rank
    ends it on every rank.
    A repeat with the same ``comm``, algorithm name and ``options=`` argument is remembered
    (``_runtime/repeats.py``): it runs without its first call's checks, under its options.
    """
    e = _find("barrier", _NO_ARRAY, _NO_ARRAY, _NO_OP, algorithm, comm, options)
    if e is not None:  # a repeat (_runtime/repeats.py)
        opts = e.opts
        e.run("barrier", e.fn, e.where, opts, timeout=opts.timeout, what=e.what)
        return
    call = run_call(BarrierCall, comm, options, None, algorithm)
    if not call.trivial and not call.opts.validate:
        ctx = context(MPI.COMM_WORLD if comm is None else comm)
        REPEATS.remember(_BarrierRepeat(call, algorithm, comm, options, ctx))


def gather(x: np.ndarray, *, root: int = 0, out: np.ndarray | None = None,
           counts: Sequence[int] | None = None, algorithm: str = "binomial",
           comm: MPI.Comm | None = None, validate: bool | None = None,
           options: Options | None = None) -> np.ndarray | None:
    """Concatenate every rank's ``x`` (flattened), in rank order, on ``root`` (1-D result).

    Returns the result on ``root`` and None elsewhere, where ``out`` is ignored. Without
    ``counts`` every rank passes the same number of elements (``MPI_Gather``); with ``counts``
    (one per rank, the same on every rank, ``counts[rank] == x.size``) blocks may differ
    (``MPI_Gatherv``). ``algorithm``: "binomial" or "native" (:data:`collectives.GATHER`).
    """
    return run_call(GatherCall, comm, options, validate, x, out, root, counts, algorithm).result


def scatter(x: np.ndarray | None, *, root: int = 0, out: np.ndarray | None = None,
            counts: Sequence[int] | None = None, algorithm: str = "binomial",
            comm: MPI.Comm | None = None, validate: bool | None = None,
            options: Options | None = None) -> np.ndarray:
    """Give every rank block ``rank`` of ``root``'s ``x`` (flattened; 1-D result).

    On ``root``, ``x`` holds p blocks: equal ones without ``counts`` (``x.size`` a multiple of
    p, ``MPI_Scatter``), ``counts[j]`` elements for rank ``j`` with it (``MPI_Scatterv``; the
    same ``counts`` on every rank). Only the root's ``x`` is read, as in MPI: other ranks pass
    ``x=None`` with ``out=`` (a 1-D array of their block's size and the root's dtype), or an
    array of the root's dtype and size (a dummy, as mpi4py users often pass; never read).
    ``algorithm``: "binomial" or "native" (:data:`collectives.SCATTER`).
    """
    return run_call(ScatterCall, comm, options, validate, x, out, root, counts, algorithm).result
