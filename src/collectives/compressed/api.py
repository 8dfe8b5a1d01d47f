"""``compressed_allreduce``: check arguments, pick the strategy, run it."""

from __future__ import annotations

from typing import Any

import numpy as np
from compress import Codec
from compress.protocols import Memory
from mpi4py import MPI

from .._runtime.arrays import check_input, check_out, flat, new_like, returned
from .._runtime.blocking import run_call
from .._runtime.context import context
from .._runtime.validate import lookup
from ..algorithms import ALGORITHMS
from ..ops import get_op
from ..options import Options
from .coding import TensorCoding
from .state import CompressionState, base_codec, state_of
from .strategies import STRATEGIES, strategy_for
from .._runtime.context import Context

__all__ = ["compressed_allreduce", "CompressedAllreduceCall", "resolve_codec"]

_OPS = ("avg", "sum")


def compressed_allreduce(x: np.ndarray, codec: str | Codec | Memory | CompressionState, *,
                         out: np.ndarray | None = None, op: str = "avg", strategy: str = "auto",
                         comm: MPI.Comm | None = None, key: Any = None, step: int | None = None,
                         algorithm: str = "auto",
                         validate: bool | None = None,
                         options: Options | None = None) -> np.ndarray:
    """Allreduce ``x`` with only ``codec``-compressed data on the wire.

    Parameters
    ----------
    x
        Contiguous float array (a dtype the codec supports), the same shape on every rank.
    codec
        A :class:`~collectives.CompressionState` (the codec, its error-feedback memory, the
        server-side memory and the step, in one object that ``state_dict()`` saves), or a
        ``compress`` codec (``compress.get("topk", ratio=0.01)``) or a memory wrapping one
        (``compress.ErrorFeedback(codec)``, ``compress.DGCMemory(...)``): then a state for that
        object is kept on the communicator; or a codec spec, as ``DistributedOptimizer``, the DDP
        hook and ``--codec`` take them (``"topk:ratio=0.01"``): a new
        ``CompressionState.from_spec(spec, rank=comm.rank)`` at every call (its codec bare, and
        seeded from this rank, so a codec with private randomness draws the same noise at every
        call), so no per-tensor state (error feedback, a generator) carries over from one call
        to the next: pass a ``CompressionState`` for that. The same on every rank.
        ``"auto:<spec>"`` (``"auto:topk:ratio=0.01"``) compresses only where the cost model
        predicts it pays, else sends dense (:mod:`collectives.compressed.auto`; a state does the
        same with ``CompressionState(..., auto=AutoCompression())``).
    out
        Result array (``x``'s shape and dtype); ``out=x`` works in place.
    op
        "avg" (the mean of the decoded contributions) or "sum". Codecs that aggregate by majority
        vote (signsgd) return the sign of the sum either way.
    strategy
        "auto" (from the codec's declared properties) or a name in
        :data:`collectives.STRATEGIES`.
    key, step
        The tensor's identity and the training step: per-tensor state (error feedback, PowerSGD's
        warm start) is kept by key, and shared-randomness codecs (randomk) draw from (key, step).
        ``step=None``: the state's ``step`` (0 for a bare codec).
    algorithm
        Dense allreduce the "summable" strategy runs on the representation.

    Returns
    -------
    numpy.ndarray
        ``out``: bitwise identical on every rank. CuPy input gives CuPy output: the codecs encode
        and decode on the device and messages go from device buffers; only the sparse strategies'
        merge of (index, value) lists runs on the host.
    """
    # the one blocking-call path (_runtime/blocking.py): a decode failure, a state mismatch, any
    # error on one rank becomes the same error on every rank still in the call
    return run_call(CompressedAllreduceCall, comm, options, validate, x, codec, out, op,
                    strategy, key, step, algorithm).result


def resolve_codec(comm: MPI.Comm, a: np.ndarray, codec: Any, op: str | None,
                  step: int | None) -> tuple[Any, Codec, Memory | None, int]:
    """The checks every compressed call makes of its codec argument (a spec, a codec, a memory
    or a :class:`CompressionState`), its dtype ``a.dtype``, its ``op`` (None: the call takes
    none) and its ``step``: ``(codec, the codec itself, the client-side memory or None, the
    step)``, where ``codec`` is the argument, or a new state for a spec. TypeError/ValueError
    here, before any message."""
    if isinstance(codec, str):  # a spec: a bad one raises ValueError here, before any message
        codec = CompressionState.from_spec(codec, rank=comm.rank)
    base = base_codec(codec)
    if not isinstance(base, Codec):
        raise TypeError(f"codec must be a codec spec (\"topk:ratio=0.01\"), a compress codec, "
                        f"a memory around one or a collectives.CompressionState, got "
                        f"{type(codec).__name__}")
    memory = codec.memory if isinstance(codec, CompressionState) else \
        (codec if isinstance(codec, Memory) else None)
    if a.dtype not in base.dtypes:
        raise TypeError(f"codec {base.name!r} does not take dtype {a.dtype}; valid: "
                        + ", ".join(str(d) for d in base.dtypes))
    if op is not None and op not in _OPS:
        raise ValueError(f"op must be one of {', '.join(_OPS)} for a compressed call, "
                         f"got {op!r}")
    the_step = (codec.step if isinstance(codec, CompressionState) else 0) if step is None else step
    if not isinstance(the_step, (int, np.integer)) or the_step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    return codec, base, memory, int(the_step)


class CompressedAllreduceCall:
    """A checked compressed allreduce (see :func:`compressed_allreduce`); ``run(ctx)`` runs the
    strategy on ``ctx.comm``. Shared by the blocking and the non-blocking entry points."""

    kind = "compressed_allreduce"
    __slots__ = ("whole", "src", "dst", "fn", "codec", "key", "step", "average", "sig",
                 "algorithm", "opts", "result", "world", "comm", "trivial")

    def __init__(self, comm: MPI.Comm, x: np.ndarray, codec: Any, out: np.ndarray | None,
                 op: str, strategy: str, key: Any, step: int | None, algorithm: str,
                 opts: Options) -> None:
        a = check_input(x)
        codec, base, memory, the_step = resolve_codec(comm, a, codec, op, step)
        auto = isinstance(codec, CompressionState) and codec.auto is not None
        name = strategy_for(base, memory, auto=auto) if strategy == "auto" else strategy
        self.fn = lookup(STRATEGIES, name, "strategy")
        lookup(ALGORITHMS, algorithm, "algorithm")
        problem = self.fn.why_not(base, memory, auto=auto)
        if problem:
            raise ValueError(problem)
        res = new_like(a) if out is None else check_out(out, a)
        self.sig = {"count": a.size, "dtype": a.dtype, "codec": base.name, "op": op,
                    "strategy": name, "step": int(the_step)}
        self.whole, self.src = a, flat(a)
        self.dst = self.src if res is a else flat(res)
        self.codec, self.key, self.step, self.average = codec, key, int(the_step), op == "avg"
        self.algorithm, self.opts, self.result = algorithm, opts, returned(x, out, res)
        self.world, self.comm = comm.size, comm
        # a single rank still compresses: it gets what the codec makes of its input
        self.trivial = a.size == 0 or comm.size == 1

    def signature(self) -> dict[str, Any]:
        return self.sig

    def _dense(self, ctx: Context, src: np.ndarray | None = None) -> None:
        """A plain allreduce of the tensor (sum or average) with ``algorithm``; ``src``: what
        to send in place of the tensor (flat, as long)."""
        src = self.src if src is None else src
        if self.world == 1:
            if self.dst is not src:
                self.dst[...] = src
            return
        op = get_op("avg" if self.average else "sum", self.whole.dtype)
        ALGORITHMS[self.algorithm](src, self.dst, op, ctx, self.opts)
        if op.average:
            op.divide(self.dst, self.world)

    def _flushed(self, state: CompressionState) -> np.ndarray:
        """What a dense step of auto sends: the tensor plus what the memory held back for its
        key (which the memory then forgets), or the tensor itself."""
        if state.memory is None:
            return self.src
        with np.errstate(over="ignore", invalid="ignore"):
            sent = state.memory.flush(self.whole, key=self.key)
        return self.src if sent is self.whole else sent.reshape(-1)

    def run(self, ctx: Context) -> None:
        if self.src.size == 0:
            return
        if ctx is None:  # a trivial call, run where it was made
            ctx = context(self.comm)
        state = state_of(self.codec, ctx)
        if self.step < state.start_step:  # dense for the first steps (CompressionState)
            self._dense(ctx)
            return
        if state.auto is not None and not state.auto.decide(
                state.codec, self.key, self.whole.shape, self.whole.dtype, self.sig["strategy"],
                self.algorithm, ctx, self.opts.node_size).compress:
            self._dense(ctx, self._flushed(state))
            return
        coding = TensorCoding(state, self.key, self.step, self.average, self.world,
                              self.whole.shape)
        # an overflowed gradient's inf or NaN propagates to every rank's result (the codecs'
        # documented rule), quietly: a NumPy warning turned into an error on one rank would hang
        with np.errstate(over="ignore", invalid="ignore"):
            if self.world == 1:  # still compress: a single rank gets what the codec makes of it
                coding.aggregate_into([coding.encode(self.whole)], self.src.size, self.dst)
            else:
                self.fn(self.src, self.dst, coding, ctx, self.opts, self.algorithm)
