"""The compressed-allreduce strategies by name, and the rule "auto" follows.

- "summable": allreduce the compressed representation (fp16, bf16, randomk, powersgd, none);
- "allgather": gather every payload, decode and aggregate (every codec);
- "sparse": SparCML sparse allreduce for codecs that declare ``sparse`` output (topk, threshold,
  dgc), with the explicit variants "sparse_recursive_doubling" and "sparse_split";
- "two_phase": DeepSpeed's all-to-all + server compression + allgather (1-bit / sign codecs).

Every strategy is ``fn(x, out, coding, ctx, opts, algorithm)`` over flat arrays; ``coding.state`` is
the call's :class:`~collectives.compressed.state.CompressionState` and ``algorithm`` the dense
allreduce that "summable" runs on the representation. What a strategy can run follows from the
protocols a codec subclasses (:mod:`compress.protocols`), never from probing its methods.
"""

from __future__ import annotations

from typing import Callable

from compress import Codec
from compress.protocols import Memory, SparsePayload

from . import allgather, sparse, summable, two_phase

__all__ = ["STRATEGIES", "strategy_for", "incompatibility"]

STRATEGIES: dict[str, Callable[..., None]] = {
    "summable": summable.allreduce,
    "allgather": allgather.allreduce,
    "sparse": sparse.allreduce,
    "sparse_recursive_doubling": sparse.allreduce_recursive_doubling,
    "sparse_split": sparse.allreduce_split,
    "two_phase": two_phase.allreduce,
}


def strategy_for(codec: Codec, memory: Memory | None = None) -> str:
    """The strategy "auto" uses for ``codec`` (the codec itself) with the client-side ``memory``.

    Sign codecs stay on "allgather" although "two_phase" sends fewer bytes and is faster on a slow
    link: its second compression, at the server, costs accuracy in training. Ask for it by name
    where the network decides (docs/benchmarks.md, "Numbers behind the code").
    """
    if summable.supports(codec, memory):
        return "summable"
    if isinstance(codec, SparsePayload):
        return "sparse"
    return "allgather"


def incompatibility(strategy: str, codec: Codec, memory: Memory | None = None) -> str | None:
    """Why ``strategy`` cannot run ``codec`` with ``memory``, or None if it can."""
    if strategy == "summable" and not summable.supports(codec):
        return f"codec {codec.name!r} is not summable; use strategy 'allgather'"
    if strategy == "summable" and not summable.supports(codec, memory):
        return (f"strategy 'summable' cannot apply {type(memory).__name__} (only "
                "compress.ErrorFeedback); use strategy 'allgather'")
    return None
