"""``osu_allgather``: latency of allgather (``collectives.allgather``).

As in OSU, the size S is what each rank contributes; every rank receives ``p * S`` bytes. Bus
bandwidth (nccl-tests) ``p S / t * (p-1) / p``.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ... import api
from ...blocks import ALLGATHER
from ...options import Options
from .collective import Buffers, Spec, entry_point, pattern

__all__ = ["SPEC", "main"]


def _buffers(count: int, dtype: np.dtype, comm: MPI.Comm) -> Buffers:
    return Buffers(pattern(count, dtype, comm.rank), np.empty(count * comm.size, dtype))


def _expected(count: int, dtype: np.dtype, comm: MPI.Comm) -> np.ndarray:
    return np.concatenate([pattern(count, dtype, r) for r in range(comm.size)])


def _call(algorithm: str, b: Buffers, comm: MPI.Comm, options: Options) -> None:
    api.allgather(b.x, out=b.out, algorithm=algorithm, comm=comm, options=options)


def _mpi(b: Buffers, comm: MPI.Comm) -> None:
    comm.Allgather(b.x, b.out)


SPEC = Spec(prog="osu_allgather", title="Allgather Latency Test", collective="allgather",
            algorithms=list(ALLGATHER), buffers=_buffers, expected=_expected, call=_call,
            bus_bytes=lambda size, p: size * p, default_algorithm="ring", mpi=_mpi)

#: Entry point (``argv`` defaults to the command line); ``python -m`` runs it.
main = entry_point(SPEC, __name__)
