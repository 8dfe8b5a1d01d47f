"""A flat sharding plan for tensors: what :mod:`.sharded` and :mod:`.fully_shard` share.

A *flat buffer* holds several tensors of one dtype end to end, padded at the end so that its
length is ``p * chunk``: rank ``r`` owns ``[r * chunk, (r + 1) * chunk)`` of it (the last ranks'
blocks may hold only padding when the tensors have fewer elements than ``p``). The padding keeps
every rank's shard the same length, so the reduce-scatter and the allgather take equal blocks
(``counts=None``); it is never read as a parameter, and its gradient is zero.

This is the minimal plan the PyTorch side needs; ``collectives.parallel.sharding`` (the NumPy
driver's plan, issue 52) describes the same offsets.

Gradients reach the shard through :func:`reduce_gradient`, the one place that reduces a flat
gradient buffer into a shard: a reduce-scatter (dense, or with a codec the compressed
reduce-scatter), for every stage: a rank updates only its block, so it needs only its block of
the averaged gradient (ZeRO stage 1 included: DeepSpeed's "ZeRO stage 1 with reduced
communication", 2020, replaced its allreduce by this reduce-scatter, 3N -> 2N bytes a step).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from .. import api as _api
from ..engine import nonblocking
from ..compressed.state import CompressionState
from ..compressed.strategies import why_not_gather, why_not_rounding
from ._common import low_rank, make_state

__all__ = ["FlatLayout", "layout", "reduce_gradient", "codec_state", "param_codec_state"]


class FlatLayout:
    """Where each tensor of a flat buffer lives and which block this rank owns.

    ``numels`` and ``shapes``: the tensors', in buffer order; ``offsets[i]:offsets[i + 1]`` is
    tensor ``i``; ``total`` their sum; ``padded = p * chunk >= total``; ``lo:hi`` this rank's
    block."""

    __slots__ = ("numels", "shapes", "offsets", "total", "chunk", "padded", "lo", "hi", "p",
                 "rank")

    def __init__(self, shapes: Sequence[torch.Size], p: int, rank: int) -> None:
        self.shapes = [torch.Size(s) for s in shapes]
        self.numels = [s.numel() for s in self.shapes]
        self.offsets = list(itertools.accumulate(self.numels, initial=0))
        self.total = self.offsets[-1]
        self.p, self.rank = p, rank
        self.chunk = -(-self.total // p) if self.total else 0
        self.padded = self.chunk * p
        self.lo, self.hi = rank * self.chunk, (rank + 1) * self.chunk

    def split_sizes(self) -> list[int]:
        """The sizes that ``torch.split`` cuts the padded buffer into: every tensor, then the
        padding (possibly 0)."""
        return self.numels + [self.padded - self.total]

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The tensors as views of ``flat`` (autograd-friendly: one split, then reshapes)."""
        pieces = flat.split(self.split_sizes())
        return [v.view(s) for v, s in zip(pieces, self.shapes)]


def layout(tensors: Sequence[torch.Tensor], p: int, rank: int) -> FlatLayout:
    return FlatLayout([t.shape for t in tensors], p, rank)


def codec_state(codec: Any, rank: int, where: str, residual_dtype: str | None = None) -> Any:
    """The compression state for ``codec=`` of ``where``; a codec that needs matrices (PowerSGD)
    cannot work on flat buckets and is refused here, before any message. ``residual_dtype``:
    the dtype error feedback keeps its residuals in (``compress.ErrorFeedback``'s), for a codec
    spec with error feedback (a codec object carries its own memory)."""
    if residual_dtype is not None:
        if not isinstance(codec, str):
            raise ValueError(f"{where}: residual_dtype= goes with a codec spec (\"topk:ratio=0.01"
                             f"\"); around a codec object pass compress.ErrorFeedback(codec, "
                             f"residual_dtype=...) as codec, got {type(codec).__name__}")
        try:
            state = CompressionState.from_spec(codec, rank=rank, error_feedback=None,
                                               residual_dtype=residual_dtype)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    else:
        state = make_state(codec, None, rank=rank)
    if low_rank(state):
        raise ValueError(f"{where}: codec {codec!r} compresses matrices (low rank); sharded "
                         "buckets are flat, use an elementwise codec (topk, qsgd, fp16, ...)")
    return state


def param_codec_state(codec: Any, rank: int, where: str = "fully_shard",
                      dtypes: Iterable[torch.dtype] = ()) -> Any:
    """The compression state for ``param_codec=`` of ``where`` (``fully_shard``,
    ``ShardedOptimizer``): no error feedback (the owner keeps the full-precision shard, so
    nothing is lost to carry over), only a codec the compressed allgather can run
    (:func:`..compressed.strategies.why_not_gather`), and only one that rounds each element on
    its own, the same way every time (fp16, bf16, eightbit, none): a sparse codec, one that
    needs error feedback, a random one or a sign codec would hand every rank parameters that
    are not a rounding of the masters. ``dtypes``: the parameters' dtypes, each of which the
    codec must take. Refused here, before any message."""
    try:
        state = make_state(codec, False, rank=rank)
    except ValueError as e:
        raise ValueError(f"{where}: param_codec {codec!r}: {e}") from None
    why = why_not_gather(state.codec, None)
    if why is None:
        why = why_not_rounding(state.codec)
    takes = [np.dtype(d).name for d in state.codec.dtypes]
    other = sorted({str(d).removeprefix("torch.") for d in dtypes} - set(takes))
    if why is None and other:
        why = (f"codec {state.codec.name!r} does not take {', '.join(other)} parameters "
               f"(it takes {', '.join(takes)})")
    if why is not None:
        raise ValueError(f"{where}: param_codec {codec!r}: {why}")
    return state


def reduce_gradient(flat: torch.Tensor, shard_out: torch.Tensor, *, comm: Any,
                    state: Any = None, key: str = "", step: int = 0, name: str | None = None,
                    blocking: bool = True) -> Any:
    """Average the flat gradient ``flat`` over the ranks of ``comm`` into this rank's block,
    ``shard_out`` (a reduce-scatter; the layout pads to p equal blocks, the call's default
    split). ``blocking=False`` returns a request whose ``wait()`` finishes the work, else None.
    With a codec state the bucket goes through the compressed reduce-scatter: each destination
    block compressed on its own, error feedback per block under ``key``.
    """
    if state is None:
        if blocking:
            _api.reduce_scatter(flat, out=shard_out, op="avg", comm=comm)
            return None
        return nonblocking.ireduce_scatter(flat, out=shard_out, op="avg", comm=comm, name=name)
    req = nonblocking.icompressed_reduce_scatter(flat, state, out=shard_out, op="avg",
                                                 comm=comm, key=key, step=step, name=name)
    if blocking:
        req.wait()
        return None
    return req
