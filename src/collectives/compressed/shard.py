"""``compressed_reduce_scatter`` and ``compressed_allgather``: the two halves of sharded training.

A sharded trainer (ZeRO stage 2-3, FSDP) reduce-scatters the gradient, so each rank gets the
aggregate of the shard it owns, and allgathers the parameters its ranks own. Both halves can
travel compressed:

- :func:`compressed_reduce_scatter`: every rank's ``x`` is the whole vector; rank ``i`` gets the
  aggregate of every rank's block ``i``, decoded (strategies in
  :data:`~collectives.compressed.strategies.SCATTER_STRATEGIES`; error feedback keeps one residual
  per destination block);
- :func:`compressed_allgather`: every rank's ``x`` is its shard; each rank encodes it, the
  payloads are allgathered (``_exchange.allgatherv``), and every rank, the owner included,
  decodes every payload, so every rank holds the same values, bitwise. The owner keeps its
  full-precision shard (the caller's ``x``); the result is the quantized view.

Both check their arguments as ``compressed_allreduce`` does (:func:`.api.resolve_codec`, the
strategy's rule), in the one blocking-call path (``_runtime/blocking.py``); the non-blocking forms
(:mod:`collectives.engine.nonblocking`) hand the same call classes to the progress engine.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from compress import Codec
from mpi4py import MPI

from .._runtime.arrays import check_input, check_out, copy_into, flat, new_like, returned
from .._runtime.blocking import run_call
from .._runtime.context import Context
from .._runtime.counts import block_offsets, gathered_offsets
from .._runtime.validate import lookup
from ..blocks import ALLGATHER, REDUCE_SCATTER
from ..ops import get_op
from ..options import Options
from ._exchange import allgatherv
from .api import resolve_codec
from .coding import TensorCoding
from .state import CompressionState
from .strategies import SCATTER_STRATEGIES, scatter_strategy_for, why_not_gather

__all__ = ["compressed_reduce_scatter", "compressed_allgather", "CompressedReduceScatterCall",
           "CompressedAllgatherCall"]

def compressed_reduce_scatter(x: np.ndarray, codec: Any, *, out: np.ndarray | None = None,
                              op: str = "avg", counts: Sequence[int] | None = None,
                              strategy: str = "auto", comm: MPI.Comm | None = None,
                              key: Any = None, step: int | None = None,
                              validate: bool | None = None,
                              options: Options | None = None) -> np.ndarray:
    """Reduce-scatter ``x`` with only ``codec``-compressed data on the wire.

    Parameters
    ----------
    x
        Contiguous float array (a dtype the codec supports), the same size on every rank: the
        whole vector (a gradient), cut into one block per rank.
    codec
        As :func:`collectives.compressed_allreduce` takes it: a codec spec, a ``compress``
        codec, a memory around one (``compress.ErrorFeedback(codec)``: one residual per
        destination block, kept by ``key``) or a :class:`~collectives.CompressionState`
        (``start_step`` honoured; ``auto`` refused).
    out
        This rank's block (1-D, ``counts[rank]`` elements, ``x``'s dtype).
    op
        "avg" (the mean of the decoded contributions) or "sum"; sign codecs (signsgd) return the
        sign of the sum either way.
    counts
        Elements per rank's block, summing to ``x.size``, the same on every rank; None: a
        near-equal split (the first ``x.size % p`` blocks one longer).
    strategy
        "auto" (from the codec's declared properties) or a name in
        :data:`~collectives.compressed.strategies.SCATTER_STRATEGIES`: "alltoall" (every codec
        but PowerSGD) or "summable" (fp16, bf16, randomk, none, PowerSGD).
    key, step
        The tensor's identity and the training step, as for ``compressed_allreduce``.

    Returns
    -------
    numpy.ndarray
        ``out``: block ``rank`` of the aggregate; computed from the payloads alone, in rank order.
    """
    return run_call(CompressedReduceScatterCall, comm, options, validate, x, codec, out, op,
                    counts, strategy, key, step).result


def compressed_allgather(x: np.ndarray, codec: Any, *, out: np.ndarray | None = None,
                         counts: Sequence[int] | None = None, comm: MPI.Comm | None = None,
                         key: Any = None, step: int | None = None,
                         validate: bool | None = None,
                         options: Options | None = None) -> np.ndarray:
    """Allgather every rank's shard ``x``, each sent ``codec``-compressed and decoded everywhere.

    Parameters
    ----------
    x
        This rank's shard (contiguous, a dtype the codec supports; read flat).
    codec
        As for :func:`compressed_reduce_scatter`; for parameters "fp16", "bf16" or
        "eightbit:bucket=256" (int8 with a scale per bucket). Not PowerSGD, not ``auto``.
    out
        The concatenation (1-D, the sum of ``counts`` elements, ``x``'s dtype).
    counts
        Elements of each rank's shard (entry ``rank`` must be ``x.size``), the same on every
        rank; None: every rank's is ``x.size``.

    Returns
    -------
    numpy.ndarray
        ``out``: every rank's decoded shard in rank order, this rank's own included (its
        quantized view, not ``x``): bitwise the same on every rank.
    """
    return run_call(CompressedAllgatherCall, comm, options, validate, x, codec, out, counts,
                    key, step).result


class _CompressedCall:
    """What the two calls share: the codec's checks, the signature, the state and coding of a
    run."""

    __slots__ = ("src", "dst", "codec", "key", "step", "average", "sig", "algorithm", "opts",
                 "result", "world", "comm", "trivial", "offsets", "shape")

    def _setup(self, comm: MPI.Comm, a: np.ndarray, codec: Any, op: str | None, key: Any,
               step: int | None, opts: Options) -> tuple[Codec, Any, bool]:
        codec, base, memory, the_step = resolve_codec(comm, a, codec, op, step)
        auto = isinstance(codec, CompressionState) and codec.auto is not None
        self.codec, self.key, self.step, self.average = codec, key, the_step, op == "avg"
        self.opts, self.world, self.comm = opts, comm.size, comm
        return base, memory, auto

    def signature(self) -> dict[str, Any]:
        return self.sig

    def run(self, ctx: Context | None) -> None:
        """Dense for the state's first steps (``CompressionState.start_step``), else
        compressed (the subclass's ``_dense`` and ``_compressed``; ``ctx`` None with one
        rank)."""
        if self.src.size == 0 and self.dst.size == 0:
            return
        state, coding = self._coding()
        if self.step < state.start_step:
            if self.world == 1:
                copy_into(self.src, self.dst)
            else:
                self._dense(ctx)
            return
        # an overflowed gradient's inf or NaN reaches the result quietly (compressed_allreduce's
        # rule): a NumPy warning turned into an error on one rank would hang the others
        with np.errstate(over="ignore", invalid="ignore"):
            self._compressed(coding, None if self.world == 1 else ctx)

    def _coding(self) -> tuple[CompressionState, TensorCoding]:
        """The call's state (a bare codec or memory's: around it; no server side here, so
        nothing to keep on the communicator) and coding."""
        state = CompressionState.of(self.codec)
        return state, TensorCoding(state, self.key, self.step, self.average, self.world,
                                   self.shape)


class CompressedReduceScatterCall(_CompressedCall):
    """A checked compressed reduce-scatter (see :func:`compressed_reduce_scatter`)."""

    kind = "compressed_reduce_scatter"
    __slots__ = ("fn",)

    def __init__(self, comm: MPI.Comm, x: np.ndarray, codec: Any, out: np.ndarray | None,
                 op: str, counts: Sequence[int] | None, strategy: str, key: Any,
                 step: int | None, opts: Options) -> None:
        a = check_input(x)
        base, memory, auto = self._setup(comm, a, codec, op, key, step, opts)
        name = scatter_strategy_for(base, memory, auto=auto) if strategy == "auto" else strategy
        self.fn = lookup(SCATTER_STRATEGIES, name, "strategy")
        problem = self.fn.why_not(base, memory, auto=auto)
        if problem:
            raise ValueError(problem)
        self.offsets = offsets = block_offsets(counts, a.size, comm.size)
        n = int(offsets[comm.rank + 1] - offsets[comm.rank])
        res = new_like(a, (n,)) if out is None else check_out(out, a, (n,))
        self.src, self.dst, self.shape = flat(a), flat(res), a.shape
        self.algorithm, self.result = name, returned(x, out, res)
        self.sig = {"count": a.size, "dtype": a.dtype, "codec": base.name, "op": op,
                    "strategy": name, "step": self.step,
                    "counts": tuple(np.diff(offsets).tolist())}
        self.trivial = a.size == 0  # a single rank still compresses

    def _dense(self, ctx: Context) -> None:
        op = get_op("avg" if self.average else "sum", self.src.dtype)
        REDUCE_SCATTER["ring"](self.src, self.dst, self.offsets, op, ctx, self.opts)
        if op.average:
            op.divide(self.dst, self.world)

    def _compressed(self, coding: TensorCoding, ctx: Context | None) -> None:
        self.fn(self.src, self.offsets, self.dst, coding, ctx, self.opts)


class CompressedAllgatherCall(_CompressedCall):
    """A checked compressed allgather (see :func:`compressed_allgather`)."""

    kind = "compressed_allgather"
    __slots__ = ()

    def __init__(self, comm: MPI.Comm, x: np.ndarray, codec: Any, out: np.ndarray | None,
                 counts: Sequence[int] | None, key: Any, step: int | None,
                 opts: Options) -> None:
        a = check_input(x)
        base, memory, auto = self._setup(comm, a, codec, None, key, step, opts)
        problem = why_not_gather(base, memory, auto=auto)
        if problem:
            raise ValueError(problem)
        self.offsets, total = gathered_offsets(comm, a, counts)
        res = new_like(a, (total,)) if out is None else check_out(out, a, (total,))
        self.src, self.dst, self.shape = flat(a), flat(res), a.shape
        self.algorithm, self.result = "allgather", returned(x, out, res)
        self.sig = {"dtype": a.dtype, "codec": base.name, "step": self.step,
                    "counts": tuple(np.diff(self.offsets).tolist())}
        self.trivial = total == 0  # a single rank still compresses

    def _dense(self, ctx: Context) -> None:
        ALLGATHER["ring"](self.src, self.dst, self.offsets, ctx, self.opts)

    def _compressed(self, coding: TensorCoding, ctx: Context | None) -> None:
        payload = coding.encode(self.src)  # in the shard's shape, under key
        payloads = [payload] if ctx is None else allgatherv(payload, ctx)
        off = self.offsets
        for k, pl in enumerate(payloads):  # the owner decodes its own payload too
            coding.decode(pl, off[k + 1] - off[k], out=self.dst[off[k]:off[k + 1]])
