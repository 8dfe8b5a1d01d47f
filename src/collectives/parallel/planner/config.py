"""What the planner chooses among: a :class:`Workload` and its :class:`Configuration` s.

A workload is the MLP of :mod:`collectives.sgd.model` (``sizes``: input, hidden widths, output)
and the global batch every configuration processes per step (the same work, so step times
compare). A configuration splits ``ranks = dp x pp x tp``:

- ``tp``: tensor parallelism, Megatron-style on consecutive pairs of Linear layers (0, 1), (2, 3),
  ...: the first column-parallel (its ``fan_out`` split), the second row-parallel (its ``fan_in``
  split); a last layer without a partner runs whole on every rank of the group. With ``tp > 1``
  the pipeline's units (*blocks*) are these pairs, so no pair straddles two stages; with
  ``tp = 1`` every layer is a block;
- ``pp``: pipeline stages of consecutive blocks (balanced by their compute and tp time, :func:`.predict.partition`),
  ``micro_batches`` micro-batches per step (``schedule`` "1f1b" or "gpipe": the same time, other
  activation memory);
- ``dp``: data parallelism over the rest, its gradient exchange dense, sharded (``shard``: ZeRO
  stage 1-3) or compressed (``codec``: a :mod:`compress` spec; with ``shard`` 0 only).

Valid (:func:`why_invalid`) where ``dp pp tp == ranks``, ``tp`` divides every hidden width,
``pp`` <= the number of blocks, ``micro_batches >= pp`` (1 when ``pp`` is 1), ``dp x
micro_batches`` divides the global batch, ``shard`` in 0-3, 0 when ``dp`` is 1 and at most 1 when
``pp`` or ``tp`` is above 1 (as the driver takes them), a codec only
with ``dp > 1`` and ``shard`` 0. :func:`configurations` lists every valid one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import compress

__all__ = ["Workload", "Configuration", "Layer", "why_invalid", "check", "configurations",
           "divisors", "SCHEDULES", "SHARD_STAGES", "codec_of"]

SCHEDULES = ("1f1b", "gpipe")
SHARD_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Layer:
    """One Linear layer's local shape on a rank of its tensor-parallel group."""

    index: int
    fan_in: int
    fan_out: int
    split: str          # "column", "row" or "whole"
    relu: bool          # a ReLU follows (every layer but the last)
    input_grad: bool    # backward computes the input's gradient (every layer but the first)


@dataclass(frozen=True)
class Workload:
    """The MLP ``sizes`` (input, hidden..., output) and the ``global_batch`` of one step."""

    sizes: tuple[int, ...]
    global_batch: int

    def __post_init__(self) -> None:
        if len(self.sizes) < 2 or min(self.sizes) < 1:
            raise ValueError(f"sizes must list input and output widths >= 1, got {self.sizes}")
        if self.global_batch < 1:
            raise ValueError(f"the global batch must be >= 1, got {self.global_batch}")

    @property
    def layers(self) -> int:
        return len(self.sizes) - 1

    @property
    def hidden(self) -> tuple[int, ...]:
        return self.sizes[1:-1]

    def blocks(self, tp: int) -> list[list[Layer]]:
        """The pipeline's units at tensor-parallel degree ``tp``, each a list of local layers."""
        n = self.layers
        out: list[list[Layer]] = []

        def layer(i: int, split: str) -> Layer:
            a, b = self.sizes[i], self.sizes[i + 1]
            a, b = (a, b // tp) if split == "column" else (a // tp, b) if split == "row" else (a, b)
            return Layer(i, a, b, split, i < n - 1, i > 0)

        i = 0
        while i < n:
            if tp > 1 and i + 1 < n:
                out.append([layer(i, "column"), layer(i + 1, "row")])
                i += 2
            else:
                out.append([layer(i, "whole")])
                i += 1
        return out


@dataclass(frozen=True)
class Configuration:
    """One way to run the workload on ``dp x pp x tp`` ranks."""

    dp: int
    pp: int
    tp: int
    micro_batches: int = 1
    shard: int = 0
    codec: str = "none"
    schedule: str = "1f1b"

    @property
    def ranks(self) -> int:
        return self.dp * self.pp * self.tp


def codec_of(spec: str) -> compress.Codec | None:
    """The codec of ``spec`` (None for "none"); ValueError naming the valid codecs."""
    if spec == "none":
        return None
    try:
        return compress.from_spec(spec)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"codec {spec!r}: {exc} (codecs: {', '.join(compress.CODECS)})") \
            from None


def why_invalid(c: Configuration, w: Workload, ranks: int) -> str | None:
    """Why ``c`` cannot run ``w`` on ``ranks`` ranks, or None when it can."""
    if min(c.dp, c.pp, c.tp, c.micro_batches) < 1:
        return f"dp, pp, tp and micro-batches must be >= 1, got {c}"
    if c.ranks != ranks:
        return f"dp x pp x tp = {c.dp} x {c.pp} x {c.tp} = {c.ranks}, not the {ranks} ranks"
    if any(h % c.tp for h in w.hidden):
        return f"tp {c.tp} does not divide every hidden width {w.hidden}"
    if c.tp > 1 and w.layers < 2:
        return "tensor parallelism needs a pair of layers"
    blocks = len(w.blocks(c.tp))
    if c.pp > blocks:
        return f"pp {c.pp} exceeds the {blocks} blocks (layers, or pairs with tp > 1) to split"
    if c.pp == 1 and c.micro_batches != 1:
        return "micro-batches > 1 without a pipeline is gradient accumulation: not planned"
    if c.micro_batches < c.pp:
        return f"micro-batches {c.micro_batches} < pp {c.pp} (GPipe and 1F1B need M >= S)"
    if w.global_batch % (c.dp * c.micro_batches):
        return (f"the global batch {w.global_batch} does not divide into dp {c.dp} x "
                f"{c.micro_batches} micro-batches")
    if c.shard not in SHARD_STAGES or (c.shard and c.dp == 1):
        return f"shard {c.shard}: ZeRO stages are 0-3, and need dp > 1"
    if c.shard > 1 and (c.pp > 1 or c.tp > 1):
        return (f"shard {c.shard} with pp {c.pp} x tp {c.tp}: ZeRO stages 2 and 3 run on a "
                "data-parallel mesh only (the driver refuses them on a split model); stage 1 "
                "composes")
    if c.schedule not in SCHEDULES:
        return f"schedule {c.schedule!r}: choose one of {', '.join(SCHEDULES)}"
    if c.codec != "none" and (c.dp == 1 or c.shard):
        return f"codec {c.codec}: compresses the dp gradient exchange: needs dp > 1, shard 0"
    try:
        codec_of(c.codec)
    except ValueError as exc:
        return str(exc)
    return None


def check(c: Configuration, w: Workload, ranks: int) -> None:
    """Raise ValueError with :func:`why_invalid`'s reason."""
    reason = why_invalid(c, w, ranks)
    if reason:
        raise ValueError(reason)


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def configurations(w: Workload, ranks: int, codecs: Sequence[str] = ("none",),
                   micro_factors: Sequence[int] = (1, 2, 4), schedule: str = "1f1b",
                   shards: Sequence[int] = SHARD_STAGES) -> Iterator[Configuration]:
    """Every valid configuration: each ``dp x pp x tp`` factorisation of ``ranks``, micro-batches
    ``pp x f`` for ``f`` in ``micro_factors`` (1 without a pipeline), every shard stage of
    ``shards`` (dense) and every codec of ``codecs`` (shard 0)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    for spec in codecs:
        codec_of(spec)
    for tp in divisors(ranks):
        for pp in divisors(ranks // tp):
            dp = ranks // tp // pp
            counts = [1] if pp == 1 else sorted({pp * f for f in micro_factors})
            for m in counts:
                variants = [(k, "none") for k in shards if "none" in codecs]
                variants += [(0, spec) for spec in codecs if spec != "none"]
                for shard, spec in variants:
                    c = Configuration(dp, pp, tp, m, shard, spec, schedule)
                    if why_invalid(c, w, ranks) is None:
                        yield c
