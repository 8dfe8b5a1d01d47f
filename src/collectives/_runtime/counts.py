"""The blocks of a call with ``counts=``: checked offsets, the same for every collective.

:func:`block_offsets` turns a reduce-scatter's (or alltoall's, scatter's) ``counts`` into the
``p + 1`` element offsets of the blocks, or splits a vector near-equally without them;
:func:`gathered_offsets` does it for an allgather or a gather, whose ``counts`` must say this
rank's own size. The dense calls (``collectives.api``) and the compressed ones
(``collectives.compressed.shard``) check ``counts`` here, with the same messages.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from mpi4py import MPI

from .ranks import partition

__all__ = ["block_offsets", "gathered_offsets"]


def block_offsets(counts: Sequence[int] | None, total: int, p: int) -> list[int]:
    """Element offsets of the p blocks: ``counts`` if given (checked), else a near-equal split."""
    if counts is None:
        return partition(total, p)
    if type(counts) is list or type(counts) is tuple:  # Python ints, the common case: no array
        offsets, at = [0], 0
        for count in counts:
            if type(count) is not int or count < 0:
                break
            at += count
            offsets.append(at)
        else:
            if len(counts) == p and at == total:
                return offsets
    sizes = np.asarray(counts)
    if sizes.shape != (p,) or sizes.dtype.kind not in "iu" or (sizes < 0).any():
        raise ValueError(f"counts must be {p} non-negative integers (one per rank), got {counts!r}")
    if int(sizes.sum()) != total:
        raise ValueError(f"counts sum to {int(sizes.sum())}, expected {total}")
    return [0] + np.cumsum(sizes).tolist()


def gathered_offsets(comm: MPI.Comm, a: np.ndarray,
                     counts: Sequence[int] | None) -> tuple[list[int], int]:
    """The block offsets of an allgather or a gather (``a.size`` from every rank, or ``counts``,
    whose entry for this rank must be ``a.size``) and their total."""
    sizes = [a.size] * comm.size if counts is None else counts
    offsets = block_offsets(sizes, int(np.sum(sizes)), comm.size)
    if int(offsets[comm.rank + 1] - offsets[comm.rank]) != a.size:
        raise ValueError(f"counts[{comm.rank}] = {offsets[comm.rank + 1] - offsets[comm.rank]}"
                         f" but x has {a.size} elements")
    return offsets, int(offsets[-1])
