"""Non-blocking and persistent collectives (MPI-4's ``MPI_Iallreduce``, ``MPI_Allreduce_init``).

``req = collectives.iallreduce(x, out=y)`` checks its arguments like ``collectives.allreduce``,
hands the operation to the communicator's progress engine (:mod:`collectives.engine`) and returns
a :class:`~collectives.engine.Request` at once; ``req.wait()`` returns ``y``. Likewise
:func:`ireduce_scatter`, :func:`iallgather`, :func:`ibcast`, :func:`ireduce`, :func:`ialltoall`,
:func:`ibarrier`, :func:`igather`, :func:`iscatter`, :func:`icompressed_allreduce`,
:func:`icompressed_reduce_scatter` and :func:`icompressed_allgather`.
:func:`allreduce_init` builds a persistent :class:`Plan`, checked once and started many times;
:func:`neighbor_allreduce_init` a persistent gossip round (:class:`NeighborPlan`), whose step
advances by one per run.

Semantics (MPI's):

- A request owns its buffers until it completes: writing ``x`` or reading ``out`` before
  ``wait()`` (or a ``True`` from ``test()``) is undefined. For CuPy arrays the current stream is
  synchronised at submission, so work queued on it before the call is in the input.
- Operations on one communicator start in the order they were submitted, and every rank must
  submit the same operations in the same order (``validate=True`` checks it and raises the same
  error on every rank from ``wait()``). Blocking and non-blocking operations of one communicator
  do not interfere: they run on different private duplicates.
- Results are bitwise identical to the blocking function's with the same arguments (the same
  algorithm code runs). Bad arguments raise at the call, before anything is sent; with
  ``validate=True`` they are raised by ``wait()`` instead, the same on every rank.
- On one process, and for empty arrays, the operation completes during the call.
- The first non-blocking call on a communicator is collective: it creates the communicator's
  progress engine (private duplicates) and returns once every rank has made its first one.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .._runtime import device as _device
from .._runtime.context import context
from .._runtime.abort_mode import runner
from .._runtime.flight import describe
from ..observe import OBSERVERS as _OBSERVED
from .._runtime.validate import check_comm, checked_call as _checked, setup as _setup
from .._runtime.repeats import REPEATS, Kind, Repeat, kind_of
from ..api import (AllgatherCall, AllreduceCall, AlltoallCall, BarrierCall, BcastCall,
                   GatherCall, OpLike, ReduceCall, ReduceScatterCall, ScatterCall)
from ..algorithms import ALGORITHMS, lanes
from ..compressed.api import CompressedAllreduceCall
from ..compressed.shard import CompressedAllgatherCall, CompressedReduceScatterCall
from . import Request, engine_of
from .engine import INLINE_BYTES
from ..decentralized.neighbor import NeighborAllgatherCall, NeighborAllreduceCall
from ..options import Options
from .._runtime.context import Context

__all__ = ["iallreduce", "ireduce_scatter", "iallgather", "ibcast", "ireduce", "ialltoall",
           "ibarrier", "igather", "iscatter", "icompressed_allreduce",
           "icompressed_reduce_scatter", "icompressed_allgather", "ineighbor_allreduce",
           "ineighbor_allgather", "allreduce_init", "Plan", "neighbor_allreduce_init",
           "NeighborPlan"]


class _OnDevice:
    """A call on CuPy arrays, run with the caller's current device (CuPy's is per thread);
    everything else is the inner call's."""

    __slots__ = ("inner", "device")

    def __init__(self, inner: Any, device: Any) -> None:
        self.inner, self.device = inner, device

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, ctx: Context) -> None:
        with self.device:
            self.inner.run(ctx)


def _make(kind: str, cls: type, data: Any, comm: MPI.Comm, validate: bool, opts: Options,
          name: str | None, *args: Any) -> tuple[Request, bool]:
    """Check the arguments (``cls(comm, *args)``) and build the request; True if it must go to
    the engine. ``data`` is the array whose place (host or device) and size decide how the
    request runs: the input, or None for a call without one (ibarrier)."""
    check_comm(kind, comm)
    device = data is not None and type(data) is not np.ndarray and _device.is_device(data)
    if device:
        _device.synchronize()  # the engine's thread must see what the caller's stream wrote
    try:
        call, error = cls(comm, *args), None
    except (TypeError, ValueError) as exc:
        if not validate or comm.size == 1:
            raise
        call, error = None, exc  # every rank will raise it from wait()
    if device and call is not None:
        call = _OnDevice(call, _device.cupy().cuda.Device())
    request = Request(kind, call, None, validate, opts, error, name)
    # small: its wait() may run it on the caller's thread (engine/engine.py)
    nbytes = 0 if data is None else getattr(data, "nbytes", INLINE_BYTES + 1)
    request.inline = not device and name is None and nbytes <= INLINE_BYTES
    return request, comm.size > 1 and (validate or not call.trivial)


def _submit(kind: str, cls: type, data: Any, comm: MPI.Comm, validate: bool, opts: Options,
            name: str | None, *args: Any) -> Request:
    """Check the arguments (``cls(comm, *args)``; ``data`` as :func:`_make`'s), build the
    request and hand it to the engine (or complete it now); the observers of ``submit``
    (``observe.py``: the timeline) hear of it at the end."""
    observers = _OBSERVED.submit  # off, this and the test at the end
    t0 = time.perf_counter() if observers else 0.0
    try:
        request, engine_needed = _make(kind, cls, data, comm, validate, opts, name, *args)
        if not engine_needed:  # one process, or nothing to send: complete now
            request.started = time.perf_counter()
            try:
                request.call.run(None)
            except Exception as exc:  # noqa: BLE001 - reported by wait(), like any failure
                request.finished = time.perf_counter()
                request.complete(exc)
            else:
                request.finished = time.perf_counter()
                request.complete()
            return request
        request.engine = engine_of(comm, opts.timeout)
        return request.engine.submit(request)
    finally:
        if observers:
            t1 = time.perf_counter()
            for observe in observers:
                observe(kind, name, t0, t1)


def iallreduce(x: np.ndarray, *, out: np.ndarray | None = None, op: OpLike = "sum",
               algorithm: str = "auto", comm: MPI.Comm | None = None,
               validate: bool | None = None, options: Options | None = None,
               name: str | None = None) -> Request:
    """Start :func:`collectives.allreduce`; ``wait()`` returns ``out``.

    Same parameters as the blocking function. A call repeated on the same host arrays (NumPy,
    CPU tensors) is remembered as the blocking one is, in the same cache
    (``_runtime/repeats.py``), and keeps the options of its first call.
    """
    # a repeat of a remembered call (_runtime/repeats.py): a training loop's every step
    e = REPEATS.find("iallreduce", x, out, op, algorithm, comm, options)
    if e is not None and name is None and validate is None:
        return e.submit(x, out)
    comm_arg = comm
    comm, opts, validate = _setup(comm, options, validate)
    remember = not validate and name is None and type(op) is str and out is not None
    request = _submit("iallreduce", _Remembered if remember else AllreduceCall, x, comm,
                      validate, opts, name, x, out, op, algorithm, opts)
    if remember and request.engine is not None and type(request.call) is _Remembered:
        xkind, okind = kind_of(x), kind_of(out)  # (device arrays: the call is _OnDevice)
        if xkind is not None and okind is not None:
            REPEATS.remember(_Resubmit(request, x, out, op, algorithm, comm_arg, options,
                                       xkind, okind))
    return request


class _Remembered(AllreduceCall):
    """An :func:`iallreduce`'s checked call that also keeps the algorithm its run decides
    ("auto" resolved) in :attr:`decided`, a box that :class:`_Resubmit` holds instead of the call
    (which holds the arrays): ``[the algorithm function, what runs it]``, the second its run
    from ``lanes.lane`` (the repeats pass arrays of this call's types), None until the first
    run decides."""

    __slots__ = ("decided",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.decided = [self.fn, None]

    def run(self, ctx: Context) -> None:
        if self.trivial:
            super().run(ctx)
            return
        decided = self.decided
        run = decided[1]
        if run is None:
            fn = decided[0] = self.decide(ctx)
            run = decided[1] = lanes.lane(fn, self.src, self.dst, self.op, ctx, self.opts)
        run(self.src, self.dst, self.op, ctx, self.opts)


class _Resubmit(Repeat):
    """A remembered :func:`iallreduce` (``_runtime/repeats.py``; host arrays: NumPy, CPU
    tensors): its repeat is a new call built from what the first one checked and decided,
    submitted to the communicator's engine (``where``; made once and never replaced: once shut
    down, the communicator freed or MPI finalizing, it is not ``live`` and the full call says
    why)."""

    __slots__ = ("inline", "reduction", "decided", "what")

    def __init__(self, request: Request, x: Any, out: Any, op: str, algorithm: str,
                 comm_arg: Any, options: Any, xkind: Kind, okind: Kind) -> None:
        call = request.call
        super().__init__("iallreduce", call, x, out, op, algorithm, comm_arg, options,
                         request.engine, xkind, okind)
        self.inline, self.reduction, self.decided = request.inline, call.op, call.decided
        self.what = None  # the flight recorder's description, made once "auto" is resolved

    def submit(self, x: Any, out: Any) -> Request:
        """Submit the call again on ``x`` and ``out`` (the remembered ones, unchanged)."""
        call = _Remembered.__new__(_Remembered)
        call.src, call.dst = self.views(x, out)
        call.op, call.fn, call.decided = self.reduction, self.decided[0], self.decided
        call.algorithm, call.opts, call.result, call.trivial = self.algorithm, self.opts, out, \
            False
        request = Request("iallreduce", call, self.where, False, self.opts)
        request.inline = self.inline
        if self.what is None:
            self.what = _described(call)
        request.what = self.what
        return self.where.submit(request)


def _described(call: AllreduceCall) -> tuple | None:
    """The flight recorder's description of ``call`` for all its runs, once its algorithm is
    decided (None before: "auto" not yet resolved)."""
    return None if call.fn is _AUTO else describe(call)


_AUTO = ALGORITHMS["auto"]


def ineighbor_allreduce(x: np.ndarray, topology: Any, *, self_weight: float | None = None,
                        weights: Any = None, out: np.ndarray | None = None,
                        comm: MPI.Comm | None = None, step: int | None = None,
                        backend: str = "p2p", hierarchical: bool = False,
                        validate: bool | None = None, options: Options | None = None,
                        name: str | None = None) -> Request:
    """Start :func:`collectives.neighbor_allreduce` (one gossip round); ``wait()`` returns
    ``out``. Same parameters as the blocking function."""
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("ineighbor_allreduce", NeighborAllreduceCall, x, comm, validate, opts, name,
                   x, topology, self_weight, weights, out, step, backend, hierarchical, opts)


def ineighbor_allgather(x: np.ndarray, topology: Any, *, out: np.ndarray | None = None,
                        comm: MPI.Comm | None = None, step: int | None = None,
                        backend: str = "p2p", validate: bool | None = None,
                        options: Options | None = None, name: str | None = None) -> Request:
    """Start :func:`collectives.neighbor_allgather` (the in-neighbors' arrays, stacked in
    ascending source rank); ``wait()`` returns ``out``. Same parameters as the blocking
    function."""
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("ineighbor_allgather", NeighborAllgatherCall, x, comm, validate, opts, name,
                   x, topology, out, step, backend, opts)


def ireduce_scatter(x: np.ndarray, *, out: np.ndarray | None = None, op: OpLike = "sum",
                    counts: Sequence[int] | None = None, algorithm: str = "ring",
                    comm: MPI.Comm | None = None, validate: bool | None = None,
                    options: Options | None = None, name: str | None = None) -> Request:
    """Start :func:`collectives.reduce_scatter`; ``wait()`` returns this rank's block."""
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("ireduce_scatter", ReduceScatterCall, x, comm, validate, opts, name, x, out,
                   op, counts, algorithm, opts)


def iallgather(x: np.ndarray, *, out: np.ndarray | None = None,
               counts: Sequence[int] | None = None, algorithm: str = "ring",
               comm: MPI.Comm | None = None, validate: bool | None = None,
               options: Options | None = None, name: str | None = None) -> Request:
    """Start :func:`collectives.allgather`; ``wait()`` returns the concatenation."""
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("iallgather", AllgatherCall, x, comm, validate, opts, name, x, out, counts,
                   algorithm, opts)


def ibcast(x: np.ndarray, *, root: int = 0, algorithm: str = "binomial",
           comm: MPI.Comm | None = None, validate: bool | None = None,
           options: Options | None = None, name: str | None = None) -> Request:
    """Start :func:`collectives.bcast` (in place); ``wait()`` returns ``x``."""
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("ibcast", BcastCall, x, comm, validate, opts, name, x, root, algorithm, opts)


def ireduce(x: np.ndarray, *, out: np.ndarray | None = None, op: OpLike = "sum", root: int = 0,
            algorithm: str = "binomial", comm: MPI.Comm | None = None,
            validate: bool | None = None, options: Options | None = None,
            name: str | None = None) -> Request:
    """Start :func:`collectives.reduce`; ``wait()`` returns the result on ``root``, else None."""
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("ireduce", ReduceCall, x, comm, validate, opts, name, x, out, op, root,
                   algorithm, opts)


def ialltoall(x: np.ndarray, *, out: np.ndarray | None = None,
              counts: Sequence[int] | None = None, algorithm: str = "auto",
              comm: MPI.Comm | None = None, validate: bool | None = None,
              options: Options | None = None, name: str | None = None) -> Request:
    """Start :func:`collectives.alltoall`; ``wait()`` returns ``out`` (equal blocks), or
    ``(y, out_counts)`` with ``counts=`` (the v form: the receive counts are learned in the
    run, and ``y`` is made then when ``out`` is None)."""
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("ialltoall", AlltoallCall, x, comm, validate, opts, name, x, out, counts,
                   algorithm, opts)


def ibarrier(*, algorithm: str = "auto", comm: MPI.Comm | None = None,
             options: Options | None = None, name: str | None = None) -> Request:
    """Start :func:`collectives.barrier` (``MPI_Ibarrier``); ``wait()`` returns None once every
    rank has entered."""
    comm, opts, validate = _setup(comm, options, None)
    return _submit("ibarrier", BarrierCall, None, comm, validate, opts, name, algorithm, opts)


def igather(x: np.ndarray, *, root: int = 0, out: np.ndarray | None = None,
            counts: Sequence[int] | None = None, algorithm: str = "binomial",
            comm: MPI.Comm | None = None, validate: bool | None = None,
            options: Options | None = None, name: str | None = None) -> Request:
    """Start :func:`collectives.gather`; ``wait()`` returns the concatenation on ``root``,
    else None."""
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("igather", GatherCall, x, comm, validate, opts, name, x, out, root, counts,
                   algorithm, opts)


def iscatter(x: np.ndarray | None, *, root: int = 0, out: np.ndarray | None = None,
             counts: Sequence[int] | None = None, algorithm: str = "binomial",
             comm: MPI.Comm | None = None, validate: bool | None = None,
             options: Options | None = None, name: str | None = None) -> Request:
    """Start :func:`collectives.scatter`; ``wait()`` returns this rank's block."""
    comm, opts, validate = _setup(comm, options, validate)
    data = out if x is None else x  # off the root, x may be None (out= then says the block)
    return _submit("iscatter", ScatterCall, data, comm, validate, opts, name, x, out, root,
                   counts, algorithm, opts)


def icompressed_allreduce(x: np.ndarray, codec: Any, *, out: np.ndarray | None = None,
                          op: str = "avg", strategy: str = "auto", comm: MPI.Comm | None = None,
                          key: Any = None, step: int = 0, algorithm: str = "auto",
                          validate: bool | None = None, options: Options | None = None,
                          name: str | None = None) -> Request:
    """Start :func:`collectives.compressed_allreduce`; ``wait()`` returns ``out``.

    The codec runs on the engine's thread: until the request completes it owns the codec's
    per-key state (error-feedback residuals) as well as the buffers.
    """
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("icompressed_allreduce", CompressedAllreduceCall, x, comm, validate, opts,
                   name, x, codec, out, op, strategy, key, step, algorithm, opts)



def icompressed_reduce_scatter(x: np.ndarray, codec: Any, *, out: np.ndarray | None = None,
                               op: str = "avg", counts: Sequence[int] | None = None,
                               strategy: str = "auto", comm: MPI.Comm | None = None,
                               key: Any = None, step: int | None = None,
                               validate: bool | None = None, options: Options | None = None,
                               name: str | None = None) -> Request:
    """Start :func:`collectives.compressed_reduce_scatter`; ``wait()`` returns this rank's
    block. The codec's per-key state belongs to the request until it completes, as for
    :func:`icompressed_allreduce`."""
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("icompressed_reduce_scatter", CompressedReduceScatterCall, x, comm, validate,
                   opts, name, x, codec, out, op, counts, strategy, key, step, opts)


def icompressed_allgather(x: np.ndarray, codec: Any, *, out: np.ndarray | None = None,
                          counts: Sequence[int] | None = None, comm: MPI.Comm | None = None,
                          key: Any = None, step: int | None = None,
                          validate: bool | None = None, options: Options | None = None,
                          name: str | None = None) -> Request:
    """Start :func:`collectives.compressed_allgather`; ``wait()`` returns the concatenation of
    every rank's decoded shard (a stage-3 trainer prefetches the next layer's parameters so)."""
    comm, opts, validate = _setup(comm, options, validate)
    return _submit("icompressed_allgather", CompressedAllgatherCall, x, comm, validate, opts,
                   name, x, codec, out, counts, key, step, opts)

class _Persistent(Request):
    """What :class:`Plan` and :class:`NeighborPlan` share: a run started (``MPI_Start``) on the
    communicator's engine, or at once with one process, and ``test``/``wait`` that end it."""

    __slots__ = ("_active",)

    def _launch(self) -> None:
        """Start the run of :attr:`call` (the caller has checked the plan)."""
        self._active = True
        self._done, self._error = False, None
        if self.engine is None:  # one process or empty: complete now
            try:
                self.call.run(None)
            except Exception as exc:  # noqa: BLE001 - reported by wait()
                self.complete(exc)
            else:
                self.complete()
            return
        self.engine.submit(self)

    def test(self) -> bool:
        if super().test():
            self._active = False
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        try:
            return super().wait(timeout)
        finally:
            if self._done:  # a timeout leaves the plan active
                self._active = False


class Plan(_Persistent):
    """A persistent allreduce (``MPI_Allreduce_init``): checked once, run many times.

    ``x`` and ``out`` are fixed: refill ``x`` between runs. Two ways to run it:

    - ``plan.start()`` ... ``plan.wait()`` (``MPI_Start``, ``MPI_Wait``): a non-blocking
      operation, queued on the communicator's engine like any request; nothing is checked again.
      Starting a plan that is still running raises ``RuntimeError`` (MPI calls it erroneous).
    - ``plan()``: the blocking form, on the caller's thread, ordered with the *blocking* calls
      of the communicator (it is ``collectives.allreduce`` with its arguments checked and its
      algorithm decided once: "auto" resolved at the first run).
      Every rank must use the same form at the same point, as for any collective.
    """

    __slots__ = ("_comm", "_device", "_allreduce", "_blocking", "_result", "_ctx")

    def __init__(self, call: AllreduceCall, comm: MPI.Intracomm, opts: Options,
                 device: Any = None) -> None:
        super().__init__("allreduce_init", call if device is None else _OnDevice(call, device),
                         None, False, opts)
        self._comm = comm        # the caller's communicator (plan() runs on its context)
        self._device = device    # the caller's CuPy device for CuPy arrays, else None
        self._allreduce = call   # the checked call, decided at the first run
        self._done = True
        self._active = False  # started, and not yet seen complete by wait() or test()
        self._blocking: Any = None
        self._ctx: Any = None  # the context the blocking run was prepared on
        # read once, from the bare call: plan() returns it with no lookup through self.call
        # (_OnDevice's __getattr__ for CuPy arrays; docs/benchmarks.md, "Numbers behind the code")
        self._result: Any = call.result
        if comm.size > 1 and not call.trivial:
            self.engine = engine_of(comm, opts.timeout)
        self.inline = device is None and call.src.nbytes <= INLINE_BYTES

    def start(self) -> "Plan":
        """Start the next run (``MPI_Start``); returns the plan."""
        if self._active:
            raise RuntimeError(f"{self.describe()} is still running: wait() before start()")
        if self.what is None:
            self.what = _described(self._allreduce)
        if self._device is not None:
            _device.synchronize()  # what the caller's stream wrote into x, before the engine reads
        self._launch()
        return self

    def __call__(self) -> Any:
        """Run once, blocking (see the class docstring); returns ``out``."""
        if self._active:
            raise RuntimeError(f"{self.describe()} is still running: wait() before running it")
        run = self._blocking
        if run is None or not self._ctx.live:  # first run, or the communicator was reset
            run = self._blocking = self._prepare_blocking()
        run()
        return self._result

    def _prepare_blocking(self) -> Any:
        """The blocking run with its algorithm decided, under the communicator's guard like
        every blocking call (``collectives._runtime.guard``), on the communicator's context
        of now (:attr:`_ctx`)."""
        call = self._allreduce
        if call.trivial:
            self._ctx = _NO_CONTEXT
            return partial(self.call.run, None)
        ctx = self._ctx = context(self._comm)
        run = runner(ctx, self.opts).run  # the guard, or abort mode's (Options.on_error)
        if self._device is not None:  # under the caller's CuPy device
            return partial(run, "allreduce", self.call.run, ctx, timeout=self.opts.timeout,
                           what=describe(call))
        # views of the plan's own: no later change to the caller's arrays (a new shape or
        # dtype set in place) reaches them, so a lane always gets the types it was made for
        src = call.src.view()
        dst = src if call.dst is call.src else call.dst.view()
        fn = lanes.lane(call.decide(ctx), src, dst, call.op, ctx, call.opts)
        return partial(run, "allreduce", fn, src, dst, call.op, ctx, call.opts,
                       timeout=self.opts.timeout, what=describe(call))


class _Always:
    """A stand-in context for a plan with nothing to run on one: always live."""

    live = True


_NO_CONTEXT = _Always()


def allreduce_init(x: np.ndarray, *, out: np.ndarray | None = None, op: OpLike = "sum",
                   algorithm: str = "auto", comm: MPI.Comm | None = None,
                   validate: bool | None = None, options: Options | None = None) -> Plan:
    """A persistent allreduce of ``x`` into ``out`` (``MPI_Allreduce_init``).

    Arguments are checked here, once; with ``validate=True`` this call cross-checks them across
    ranks (collectively, like a blocking call) and every rank raises the same error. The
    algorithm ("auto" resolved once) is fixed at the first run. Call
    ``plan()`` (blocking), or ``plan.start()`` ... ``plan.wait()`` (non-blocking), as often as
    needed, refilling ``x`` in between. See :class:`Plan`.
    """
    comm, opts, validate = _setup(comm, options, validate)
    call = _checked(AllreduceCall, comm, validate, x, out, op, algorithm, opts)
    device = _device.cupy().cuda.Device() if (type(x) is not np.ndarray
                                                and _device.is_device(x)) else None
    return Plan(call, comm, opts, device)


class NeighborPlan(_Persistent):
    """A persistent gossip round (``MPI_Neighbor_allgather_init`` with the weighted combination):
    checked once, one round of :func:`collectives.neighbor_allreduce` per run.

    ``x`` and ``out`` are fixed (refill ``x`` between runs); each run checks only that neither
    was reshaped or resized in place since (ValueError). :attr:`step` is the step of the next
    run: it starts at ``step`` and advances by one per run, so a time-varying topology
    (``one_peer_exponential``) takes its next graph each time; the checked call of every step
    of the period is made at construction. Run it as :class:`Plan`: ``start()`` ... ``wait()``
    (on the communicator's engine, like ``ineighbor_allreduce``) or ``plan()`` (blocking, on
    the caller's thread, ordered with the blocking calls); each gives the bits
    ``neighbor_allreduce(x, topology, step=s)`` gives. Starting a running plan raises
    ``RuntimeError``; :meth:`free` (``MPI_Request_free``) releases it, after which every use
    raises ``RuntimeError``.
    """

    __slots__ = ("_comm", "_calls", "_arrays", "_freed", "step")

    def __init__(self, calls: list[NeighborAllreduceCall], arrays: list[tuple[Any, tuple]],
                 comm: MPI.Intracomm, opts: Options, step: int) -> None:
        super().__init__("neighbor_allreduce_init", calls[0], None, False, opts)
        self._comm, self._calls, self._arrays = comm, calls, arrays
        self._done = True
        self._active = False  # started, and not yet seen complete by wait() or test()
        self._freed = False
        #: the step of the next run
        self.step = step
        if comm.size > 1 and not calls[0].trivial:
            self.engine = engine_of(comm, opts.timeout)

    def _next(self, what: str) -> NeighborAllreduceCall:
        """The checked call of the next run (its step taken), after the plan's own checks."""
        if self._freed:
            raise RuntimeError(f"{what}: this neighbor_allreduce_init plan was freed")
        if self._active:
            raise RuntimeError(f"{what}: {self.describe()} is still running: wait() first")
        for name, (a, shape) in zip(("x", "out"), self._arrays):
            if tuple(a.shape) != shape:
                raise ValueError(f"{what}: {name} has shape {tuple(a.shape)}, but the plan was "
                                 f"made for {shape} (its buffers are fixed: make a new plan)")
        call = self._calls[self.step % len(self._calls)]
        self.step += 1
        return call

    def start(self) -> "NeighborPlan":
        """Start the next round (``MPI_Start``); returns the plan."""
        self.call = self._next("start()")
        self._launch()
        return self

    def wait(self, timeout: float | None = None) -> Any:
        if self._freed:
            raise RuntimeError("wait(): this neighbor_allreduce_init plan was freed")
        return super().wait(timeout)

    def __call__(self) -> Any:
        """Run the next round, blocking; returns ``out``."""
        call = self.call = self._next("plan()")
        if call.trivial or self._comm.size == 1:
            call.run(None)
            return call.result
        ctx = context(self._comm)
        runner(ctx, self.opts).run(self.kind, call.run, ctx, timeout=self.opts.timeout,
                                   what=describe(call))
        return call.result

    def free(self) -> None:
        """Release the plan (``MPI_Request_free``); a running one must be waited for first."""
        if self._active:
            raise RuntimeError(f"free(): {self.describe()} is still running: wait() first")
        self._freed = True
        self._calls, self._arrays = [], []


def neighbor_allreduce_init(x: Any, topology: Any, *, self_weight: float | None = None,
                            weights: Any = None, out: Any = None, comm: MPI.Comm | None = None,
                            step: int = 0, backend: str = "p2p", hierarchical: bool = False,
                            validate: bool | None = None,
                            options: Options | None = None) -> NeighborPlan:
    """A persistent :func:`collectives.neighbor_allreduce` of ``x`` into ``out``.

    Arguments are checked here, once, for every step of the topology's period (with
    ``validate=True`` also across ranks, collectively); ``step`` (default 0) is the step of the
    first run, and each run advances it by one. See :class:`NeighborPlan`.
    """
    comm, opts, validate = _setup(comm, options, validate)
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
        raise ValueError(f"neighbor_allreduce_init: step must be a non-negative integer (the "
                         f"step of the first run), got {step!r}")
    period = getattr(topology, "period", 1)
    calls: list[NeighborAllreduceCall] = []
    for t in range(period):  # call k runs the steps s with s % period == k
        target = out if not calls else calls[0].result
        calls.append(_checked(NeighborAllreduceCall, comm, validate, x, topology, self_weight,
                              weights, target, t, backend, hierarchical, opts))
    result = calls[0].result
    return NeighborPlan(calls, [(x, tuple(x.shape)), (result, tuple(result.shape))], comm,
                        opts, int(step))
