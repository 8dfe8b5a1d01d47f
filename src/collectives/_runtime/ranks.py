"""Rank and block arithmetic: which part of a vector each rank handles, and who stands in for whom.

- :func:`partition` and :func:`split`: near-equal blocks of a vector (as ``np.array_split``), the
  blocks of reduce-scatter, allgather and every algorithm built from them;
  :func:`nsegments`: how many segments a pipelined algorithm cuts each block into.
- :func:`pof2_of` and :func:`real_rank`: the power-of-two group of MPICH's fold
  (``algorithms/pof2.py`` runs the fold; the cost model counts its messages).

Plain Python integers: this runs on every call, where NumPy's per-call overhead would dominate.
"""

from __future__ import annotations

__all__ = ["partition", "split", "nsegments", "pof2_of", "real_rank"]


def nsegments(longest: int, itemsize: int, segment_bytes: int) -> int:
    """How many segments a pipelined algorithm cuts each block into (at least one).

    Every block of one call is cut into the same number of segments, so that the two partners of
    each exchange always agree on how many messages follow, even when blocks differ in length.
    """
    seg = max(1, segment_bytes // itemsize)
    return max(1, -(-longest // seg))


def split(lo: int, hi: int, parts: int) -> list[slice]:
    """The element range [lo, hi) as ``parts`` consecutive near-equal slices (some may be empty)."""
    if parts == 1:
        return [slice(lo, hi)]
    offsets = partition(hi - lo, parts)
    return [slice(lo + a, lo + b) for a, b in zip(offsets[:-1], offsets[1:])]


def partition(count: int, parts: int) -> list[int]:
    """Offsets (length ``parts + 1``) splitting ``count`` elements into near-equal blocks.

    Like ``np.array_split``: the first ``count % parts`` blocks hold one element more. Plain
    Python integers: this runs on every call, where NumPy's per-call overhead would dominate.
    """
    base, extra = divmod(count, parts)
    return [i * base + min(i, extra) for i in range(parts + 1)]


def pof2_of(p: int) -> int:
    """Largest power of two <= p."""
    return 1 << (p.bit_length() - 1)


def real_rank(newrank: int, rem: int) -> int:
    """The communicator rank playing ``newrank`` in the power-of-two group."""
    return newrank * 2 + 1 if newrank < rem else newrank + rem
