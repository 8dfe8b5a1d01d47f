"""The compressed-allreduce strategies by name, each with the rule of when it applies.

- "summable": allreduce the compressed representation (fp16, bf16, randomk, powersgd, none);
- "allgather": gather every payload, decode and aggregate (every codec);
- "sparse": SparCML sparse allreduce, made for codecs that declare ``sparse`` output (topk,
  threshold, dgc; any other codec's decoded payload travels as its nonzeros), with the explicit
  variants "sparse_recursive_doubling" and "sparse_split";
- "two_phase": DeepSpeed's all-to-all + server compression + allgather (1-bit / sign codecs).

The compressed reduce-scatter's strategies are :data:`SCATTER_STRATEGIES` ("alltoall": every
codec a block of the flat vector can be encoded with, "summable": the summable codecs, PowerSGD
on the whole matrix; :mod:`.reduce_scatter`), with the same :class:`Strategy` entries; the
compressed allgather has one way to run and one rule, :func:`why_not_gather`.

Each entry of :data:`STRATEGIES` is a :class:`Strategy`: its run function and its one
applicability rule, :meth:`Strategy.why_not` (Horovod's ``Enabled`` beside ``Execute``).
``compressed_allreduce``'s checks, its error messages, the SGD driver's and the benchmarks' checks
and :func:`strategy_for` (what ``strategy="auto"`` runs) all read that rule.

Every run function is ``fn(x, out, coding, ctx, opts, algorithm)`` over flat arrays;
``coding.state`` is the call's :class:`~collectives.compressed.state.CompressionState` and
``algorithm`` the dense allreduce that "summable" runs on the representation. What a strategy can
run follows from the protocols a codec subclasses (:mod:`compress.protocols`), never from probing
its methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from compress import Codec, ErrorFeedback
from compress.protocols import SUMMABLE, LowRankSummable, Memory, SparsePayload

from . import allgather, reduce_scatter, sparse, summable, two_phase

__all__ = ["Strategy", "STRATEGIES", "AUTO_ORDER", "strategy_for", "SCATTER_STRATEGIES",
           "SCATTER_AUTO_ORDER", "scatter_strategy_for", "why_not_gather", "why_not_rounding"]

#: ``why_not(codec, memory, auto)``: the reason a strategy cannot run, or None
Rule = Callable[[Codec, "Memory | None", bool], "str | None"]


def _any(codec: Codec, memory: Memory | None, auto: bool) -> str | None:
    return None


def _summable(codec: Codec, memory: Memory | None, auto: bool) -> str | None:
    # the representation itself is summed, and the residual is kept by error feedback's
    # compensate/remember pair (summable.py)
    if not isinstance(codec, SUMMABLE):
        return f"codec {codec.name!r} is not summable; use strategy 'allgather'"
    if memory is not None and not isinstance(memory, ErrorFeedback):
        return (f"strategy 'summable' cannot apply {type(memory).__name__} (only "
                "compress.ErrorFeedback); use strategy 'allgather'")
    return None


def _two_phase(codec: Codec, memory: Memory | None, auto: bool) -> str | None:
    if auto:
        return ("auto compression cannot run strategy 'two_phase' (its residuals are kept per "
                "chunk, on the server too); use another strategy")
    return None


@dataclass(frozen=True, eq=False)
class Strategy:
    """One compressed-allreduce strategy: how it runs and when it applies.

    Parameters
    ----------
    name : str
        Its name in :data:`STRATEGIES`.
    run : callable
        ``run(x, out, coding, ctx, opts, algorithm)``; calling the strategy calls it.
    rule : callable
        ``rule(codec, memory, auto)``: why it cannot run ``codec`` with the client-side
        ``memory`` (``auto``: under :class:`~collectives.AutoCompression`), or None.
    suits : callable
        ``suits(codec)``: whether ``strategy="auto"`` takes it for a codec it applies to (read
        for the entries of :data:`AUTO_ORDER` only: the others are never "auto"'s).
    """

    name: str
    run: Callable[..., None]
    rule: Rule = _any
    suits: Callable[[Codec], bool] = lambda codec: True

    def why_not(self, codec: Codec, memory: Memory | None = None, *,
                auto: bool = False) -> str | None:
        """Why this strategy cannot run ``codec`` (the codec itself) with ``memory``, or None."""
        return self.rule(codec, memory, auto)

    def applies(self, codec: Codec, memory: Memory | None = None, *, auto: bool = False) -> bool:
        """Whether this strategy can run ``codec`` with ``memory``."""
        return self.rule(codec, memory, auto) is None

    def __call__(self, *args: Any) -> None:
        self.run(*args)

    def __repr__(self) -> str:
        return f"Strategy({self.name!r})"


def _sparse_output(codec: Codec) -> bool:
    return isinstance(codec, SparsePayload)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("summable", summable.allreduce, _summable),
    Strategy("allgather", allgather.allreduce),
    Strategy("sparse", sparse.allreduce, suits=_sparse_output),
    Strategy("sparse_recursive_doubling", sparse.allreduce_recursive_doubling),
    Strategy("sparse_split", sparse.allreduce_split),
    Strategy("two_phase", two_phase.allreduce, _two_phase),
)}

#: what ``strategy="auto"`` tries, in order: the first that applies and suits the codec.
#: Sign codecs stay on "allgather" although "two_phase" sends fewer bytes and is faster on a
#: slow link: its second compression, at the server, costs accuracy in training. Ask for it by
#: name where the network decides (docs/benchmarks.md, "Numbers behind the code").
AUTO_ORDER = ("summable", "sparse", "allgather")


def strategy_for(codec: Codec, memory: Memory | None = None, *, auto: bool = False) -> str:
    """The strategy ``strategy="auto"`` runs for ``codec`` (the codec itself) with the
    client-side ``memory`` (``auto``: under :class:`~collectives.AutoCompression`)."""
    for name in AUTO_ORDER:
        s = STRATEGIES[name]
        if s.applies(codec, memory, auto=auto) and s.suits(codec):
            return name
    raise AssertionError("'allgather' applies to every codec")  # pragma: no cover


# -- the compressed reduce-scatter's strategies (reduce_scatter.py) and the allgather's rule -------
_NO_AUTO = ("auto compression cannot run in a compressed reduce-scatter or allgather (its cost "
            "model decides for an allreduce); pass the codec itself")


def _blocks(codec: Codec, memory: Memory | None, auto: bool) -> str | None:
    if auto:
        return _NO_AUTO
    if isinstance(codec, LowRankSummable):
        return (f"codec {codec.name!r} factors the whole matrix, and a block of the flat vector "
                f"is 1-d, which it sends uncompressed; use strategy 'summable'")
    return None


def _summable_blocks(codec: Codec, memory: Memory | None, auto: bool) -> str | None:
    return _NO_AUTO if auto else _summable(codec, memory, auto)


#: ``run(x, offsets, out, coding, ctx, opts)``: block ``rank`` of the aggregate into ``out``
SCATTER_STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("alltoall", reduce_scatter.alltoall, _blocks),
    Strategy("summable", reduce_scatter.summable, _summable_blocks),
)}

#: what a compressed reduce-scatter's ``strategy="auto"`` tries, in order: "alltoall" sends the
#: bytes "summable" sends for element codecs (fp16, bf16, random-k), plus a header per block, and
#: sums the decoded values in float32 rather than in the representation; "summable" is the way
#: a low-rank codec (PowerSGD) compresses at all.
SCATTER_AUTO_ORDER = ("alltoall", "summable")


def scatter_strategy_for(codec: Codec, memory: Memory | None = None, *,
                         auto: bool = False) -> str:
    """The strategy a compressed reduce-scatter's ``strategy="auto"`` runs for ``codec`` with
    ``memory``; ValueError with every entry's reason where none applies."""
    reasons = []
    for name in SCATTER_AUTO_ORDER:
        reason = SCATTER_STRATEGIES[name].why_not(codec, memory, auto=auto)
        if reason is None:
            return name
        reasons.append(f"{name}: {reason}")
    raise ValueError(f"codec {codec.name!r} cannot run in a compressed reduce-scatter ("
                     + "; ".join(reasons) + ")")


def why_not_rounding(codec: Codec) -> str | None:
    """Why ``codec`` cannot carry parameters (ZeRO's allgather after the update, a
    ``param_codec``), or None: parameters travel rounded, every element on its own and the same
    way every time, so that every rank computes with the same rounding of the owners' masters;
    a sparse codec, one that needs error feedback, a random one or one that aggregates by
    another rule than the mean would hand the ranks something else."""
    what = ("keeps only some elements" if codec.sparse
            else "needs error feedback" if codec.needs_error_feedback
            else "rounds at random" if codec.randomness is not None
            else f"aggregates by {codec.aggregation}" if codec.aggregation != "mean"
            else None)
    if what is None:
        return None
    return (f"codec {codec.name!r} {what}; parameters travel rounded, every element on its own "
            f"and the same way every time: use fp16, bf16 or eightbit")


def why_not_gather(codec: Codec, memory: Memory | None = None, *,
                   auto: bool = False) -> str | None:
    """Why a compressed allgather (every rank's shard encoded by itself, every payload decoded
    on every rank) cannot run ``codec``, or None."""
    if auto:
        return _NO_AUTO
    if isinstance(codec, LowRankSummable):
        return (f"codec {codec.name!r} factors a matrix across ranks, and a shard is encoded by "
                f"itself as a 1-d vector, which it sends uncompressed; use fp16, bf16 or "
                f"eightbit for parameters")
    return None
