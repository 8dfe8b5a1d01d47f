"""``osu_scatter``: latency of scatter from rank 0 (``collectives.scatter``).

As in OSU, the size S is what each rank receives; rank 0 holds ``p * S`` bytes, block ``j`` for
rank ``j`` (:func:`pattern` of ``j``). The other ranks pass an array of the root's size that is
never read (as mpi4py users often do). Bus bandwidth (nccl-tests) ``p S / t * (p-1) / p``.
``--algorithm`` names an entry of :data:`collectives.SCATTER` (default ``binomial``), ``mpi``
(``comm.Scatter`` from mpi4py) or ``all``.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ...blocks import SCATTER
from .collective import Buffers, Spec, entry_point, pattern, rooted

__all__ = ["SPEC", "main"]


def _buffers(count: int, dtype: np.dtype, comm: MPI.Comm) -> Buffers:
    if comm.rank == 0:
        x = np.concatenate([pattern(count, dtype, r) for r in range(comm.size)])
    else:
        x = np.zeros(count * comm.size, dtype)
    return Buffers(x, np.zeros(count, dtype))


def _expected(count: int, dtype: np.dtype, comm: MPI.Comm) -> np.ndarray:
    return pattern(count, dtype, comm.rank)


SPEC = Spec(prog="osu_scatter", title="Scatter Latency Test", collective="scatter",
            algorithms=list(SCATTER), buffers=_buffers, expected=_expected,
            bus_bytes=lambda size, p: size * p, default_algorithm="binomial",
            **rooted("scatter", MPI.Comm.Scatter))

#: Entry point (``argv`` defaults to the command line); ``python -m`` runs it.
main = entry_point(SPEC, __name__)
