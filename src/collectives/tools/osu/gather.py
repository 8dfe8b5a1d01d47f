"""``osu_gather``: latency of gather to rank 0 (``collectives.gather``).

As in OSU, the size S is what each rank contributes; rank 0 receives ``p * S`` bytes (the other
ranks' ``out`` stays as it was, zeros). Bus bandwidth (nccl-tests) ``p S / t * (p-1) / p``.
``--algorithm`` names an entry of :data:`collectives.GATHER` (default ``binomial``), ``mpi``
(``comm.Gather`` from mpi4py) or ``all``.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ...blocks import GATHER
from .collective import Buffers, Spec, entry_point, pattern, rooted

__all__ = ["SPEC", "main"]


def _buffers(count: int, dtype: np.dtype, comm: MPI.Comm) -> Buffers:
    return Buffers(pattern(count, dtype, comm.rank), np.zeros(count * comm.size, dtype))


def _expected(count: int, dtype: np.dtype, comm: MPI.Comm) -> np.ndarray:
    if comm.rank:
        return np.zeros(count * comm.size, dtype)
    return np.concatenate([pattern(count, dtype, r) for r in range(comm.size)])


SPEC = Spec(prog="osu_gather", title="Gather Latency Test", collective="gather",
            algorithms=list(GATHER), buffers=_buffers, expected=_expected,
            bus_bytes=lambda size, p: size * p, default_algorithm="binomial",
            **rooted("gather", MPI.Comm.Gather))

#: Entry point (``argv`` defaults to the command line); ``python -m`` runs it.
main = entry_point(SPEC, __name__)
