"""``osu_reduce_scatter``: latency of reduce-scatter (``collectives.reduce_scatter``).

As in OSU, the size S is the whole vector each rank contributes; rank r receives block r of the
sum (near-equal blocks). Bus bandwidth ``S / t * (p-1) / p`` (nccl-tests).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ... import api
from ..._runtime.ranks import partition
from ...blocks import REDUCE_SCATTER
from ...options import Options
from .collective import Buffers, Spec, entry_point, pattern

__all__ = ["SPEC", "main"]


def _buffers(count: int, dtype: np.dtype, comm: MPI.Comm) -> Buffers:
    offsets = partition(count, comm.size)
    block = offsets[comm.rank + 1] - offsets[comm.rank]
    return Buffers(pattern(count, dtype, comm.rank), np.empty(block, dtype))


def _expected(count: int, dtype: np.dtype, comm: MPI.Comm) -> np.ndarray:
    total = np.sum([pattern(count, dtype, r) for r in range(comm.size)], axis=0, dtype=dtype)
    offsets = partition(count, comm.size)
    return total[offsets[comm.rank]:offsets[comm.rank + 1]]


def _call(algorithm: str, b: Buffers, comm: MPI.Comm, options: Options) -> None:
    api.reduce_scatter(b.x, out=b.out, algorithm=algorithm, comm=comm, options=options)


def _mpi(b: Buffers, comm: MPI.Comm) -> None:
    counts = [int(c) for c in np.diff(partition(b.x.size, comm.size))]
    comm.Reduce_scatter(b.x, b.out, recvcounts=counts, op=MPI.SUM)


SPEC = Spec(prog="osu_reduce_scatter", title="Reduce_scatter Latency Test",
            collective="reduce_scatter", algorithms=list(REDUCE_SCATTER), buffers=_buffers,
            expected=_expected, call=_call, default_algorithm="ring", mpi=_mpi)

#: Entry point (``argv`` defaults to the command line).
main = entry_point(SPEC)


if __name__ == "__main__":
    import sys

    from ..._runtime.cli import program

    sys.exit(program("osu_reduce_scatter", main)())
