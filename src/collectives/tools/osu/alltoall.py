"""``osu_alltoall``: latency of alltoall (``collectives.alltoall``), OSU Micro-Benchmarks 7.x style.

As in OSU, the size S is one block: every rank sends S bytes to every rank (itself included)
and receives as much, ``p * S`` bytes in and out. Block ``j`` of rank ``i`` holds
:func:`block` ``(i, j)``, so the correct result is known without a reference run. Bus
bandwidth (nccl-tests) ``p S / t * (p-1) / p``. ``--algorithm`` names an entry of
:data:`collectives.ALLTOALL` (default ``auto``), ``mpi`` (``comm.Alltoall`` from mpi4py) or
``all``.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ... import api
from ...algorithms import ALLTOALL
from ...options import Options
from .collective import Buffers, Spec, entry_point

__all__ = ["SPEC", "block", "buffers", "expected", "main"]


def block(count: int, dtype: np.dtype, src: int, dst: int) -> np.ndarray:
    """The block rank ``src`` sends rank ``dst``: small integers, exact in every dtype."""
    return ((np.arange(count) + 3 * src + dst) % 11 + 1).astype(dtype)


def buffers(count: int, dtype: np.dtype, comm: MPI.Comm) -> Buffers:
    x = np.concatenate([block(count, dtype, comm.rank, j) for j in range(comm.size)])
    return Buffers(x, np.empty_like(x))


def expected(count: int, dtype: np.dtype, comm: MPI.Comm) -> np.ndarray:
    return np.concatenate([block(count, dtype, i, comm.rank) for i in range(comm.size)])


def _call(algorithm: str, b: Buffers, comm: MPI.Comm, options: Options) -> None:
    api.alltoall(b.x, out=b.out, algorithm=algorithm, comm=comm, options=options)


def _mpi(b: Buffers, comm: MPI.Comm) -> None:
    comm.Alltoall(b.x, b.out)


SPEC = Spec(prog="osu_alltoall", title="All-to-All Personalized Exchange Latency Test",
            collective="alltoall", algorithms=list(ALLTOALL), buffers=buffers,
            expected=expected, call=_call, bus_bytes=lambda size, p: size * p, mpi=_mpi)

#: Entry point (``argv`` defaults to the command line).
main = entry_point(SPEC)


if __name__ == "__main__":
    import sys

    from ..._runtime.cli import program

    sys.exit(program("osu_alltoall", main)())
