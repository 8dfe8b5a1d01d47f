"""A sharding plan as data: which rank owns which flat slice of a fusion buffer.

Sharded data parallelism (ZeRO, Rajbhandari et al. SC 2020; PyTorch FSDP) splits the flat
parameter vector of ``n`` elements into ``p`` contiguous *shards*, one per rank: rank ``r`` owns
``[offsets[r], offsets[r+1])``, ``counts[r]`` elements. The owner keeps the optimizer state of its
shard (stage 1), the reduced gradient of it (stage 2) and the parameters of it (stage 3). The
plan is what every party reads the same way: the optimizer step (which slice it updates), the
checkpoint writer (which slice a rank saves), the reduce-scatter of the gradient and the
allgather of the parameters (``collectives.reduce_scatter(x, out=, counts=)`` and
``collectives.allgather(x, out=, counts=)`` take :attr:`ShardPlan.counts`), and a compressed
reduce-scatter's error-feedback state (one residual per owned slice).

By default the split is even, as the ring's blocks (``_runtime.ranks.partition``): the first
``n % p`` shards hold one element more. With that split, a ring reduce-scatter sums every element
in the same order as ring allreduce does (each block is reduced along the ring ending at its
owner), so sharded training gives the bits of data parallelism.

The flat vector is also a sequence of *layers* (contiguous ranges, for the MLP a weight and its
bias): a layer may span several shards and a shard several layers, and a layer smaller than
``p`` elements leaves some ranks without a piece of it. :meth:`ShardPlan.split` cuts any range
(a layer, a gradient bucket) into the pieces each rank owns: the ``counts`` of a reduce-scatter
or allgather of that range alone, and where this rank's piece sits in its shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["ShardPlan", "Piece"]


@dataclass(frozen=True)
class Piece:
    """The split of one flat range ``[lo, hi)`` over the shards: ``counts[r]`` elements of it
    belong to rank ``r`` (zero for ranks whose shard it misses); ``start`` is where the range's
    piece of rank ``rank`` begins inside that rank's shard and ``offset`` where it begins inside
    the range."""

    lo: int
    hi: int
    counts: tuple[int, ...]
    rank: int
    start: int
    offset: int

    @property
    def mine(self) -> slice:
        """This rank's piece as a slice of its shard."""
        return slice(self.start, self.start + self.counts[self.rank])

    @property
    def local(self) -> slice:
        """This rank's piece as a slice of the range."""
        return slice(self.offset, self.offset + self.counts[self.rank])


@dataclass(frozen=True)
class ShardPlan:
    """Which rank owns which slice of a flat vector of ``layers`` (element counts, in order).

    Parameters
    ----------
    layers
        Elements of every layer, in the order they lie in the flat vector.
    world
        Number of ranks (shards).
    counts
        Elements each rank owns (one per rank, summing to the total); None: the even split
        (the first ``n % p`` ranks one more).

    Raises
    ------
    ValueError
        Negative layer sizes, ``world < 1``, or counts that are not ``world`` non-negative
        integers summing to the total.
    """

    layers: tuple[int, ...]
    world: int
    counts: tuple[int, ...] = ()
    offsets: tuple[int, ...] = field(init=False)
    bounds: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        layers = tuple(int(s) for s in self.layers)
        if any(s < 0 for s in layers):
            raise ValueError(f"layer sizes must be non-negative, got {self.layers}")
        if not isinstance(self.world, int) or self.world < 1:
            raise ValueError(f"world must be a positive integer, got {self.world!r}")
        total = sum(layers)
        if not self.counts:
            base, extra = divmod(total, self.world)
            counts = tuple(base + (r < extra) for r in range(self.world))
        else:
            counts = tuple(int(c) for c in self.counts)
            if len(counts) != self.world or any(c < 0 for c in counts) or sum(counts) != total:
                raise ValueError(f"counts must be {self.world} non-negative integers summing to "
                                 f"{total}, got {self.counts}")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "offsets", _cumulative(counts))
        object.__setattr__(self, "bounds", _cumulative(layers))

    @property
    def total(self) -> int:
        """Elements of the whole flat vector."""
        return self.offsets[-1]

    @property
    def largest(self) -> int:
        """Elements of the largest shard."""
        return max(self.counts)

    def shard(self, rank: int) -> slice:
        """Rank ``rank``'s shard as a slice of the flat vector."""
        return slice(self.offsets[rank], self.offsets[rank + 1])

    def layer(self, i: int) -> slice:
        """Layer ``i`` as a slice of the flat vector."""
        return slice(self.bounds[i], self.bounds[i + 1])

    def split(self, lo: int, hi: int, rank: int) -> Piece:
        """The flat range ``[lo, hi)`` cut at the shards' boundaries, seen from ``rank``."""
        if not 0 <= lo <= hi <= self.total:
            raise ValueError(f"range [{lo}, {hi}) is not inside [0, {self.total})")
        counts = tuple(max(0, min(hi, b) - max(lo, a))
                       for a, b in zip(self.offsets, self.offsets[1:]))
        a = self.offsets[rank]
        first = max(lo, a)
        return Piece(lo, hi, counts, rank, start=first - a if counts[rank] else 0,
                     offset=first - lo if counts[rank] else 0)

    def split_layer(self, i: int, rank: int) -> Piece:
        """Layer ``i`` cut at the shards' boundaries (:meth:`split`)."""
        return self.split(self.bounds[i], self.bounds[i + 1], rank)

    def buckets(self, lo: int, hi: int, size: int) -> list[tuple[int, int]]:
        """The range ``[lo, hi)`` in consecutive ranges of at most ``size`` elements."""
        size = max(1, int(size))
        return [(a, min(a + size, hi)) for a in range(lo, hi, size)]


def _cumulative(sizes: Sequence[int]) -> tuple[int, ...]:
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return tuple(out)
