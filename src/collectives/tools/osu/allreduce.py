"""``osu_allreduce``: latency of every allreduce algorithm, OSU Micro-Benchmarks 7.x style.

``mpiexec -n 4 osu_allreduce -m 8:1048576 --algorithm all -c`` times ``collectives.allreduce``
(sum, out of place) for each message size S (bytes per rank) and prints OSU's table; bus
bandwidth is ``S / t * 2 (p-1) / p``. Every rank starts from :func:`pattern` of its rank, so the
correct result is known without a reference run.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ... import api
from ..._runtime.context import context
from ...algorithms import ALGORITHMS, shm
from ...options import Options
from .collective import Buffers, Spec, entry_point, pattern

__all__ = ["SPEC", "main"]


def _buffers(count: int, dtype: np.dtype, comm: MPI.Comm) -> Buffers:
    x = pattern(count, dtype, comm.rank)
    return Buffers(x, np.empty_like(x))


def _expected(count: int, dtype: np.dtype, comm: MPI.Comm) -> np.ndarray:
    return np.sum([pattern(count, dtype, r) for r in range(comm.size)], axis=0, dtype=dtype)


def _call(algorithm: str, b: Buffers, comm: MPI.Comm, options: Options) -> None:
    api.allreduce(b.x, out=b.out, algorithm=algorithm, comm=comm, options=options)


def _mpi(b: Buffers, comm: MPI.Comm) -> None:
    comm.Allreduce(b.x, b.out, op=MPI.SUM)


def _available(name: str, comm: MPI.Comm, options: Options) -> bool:
    """"shm" only where every rank shares a node (elsewhere it raises)."""
    return name != "shm" or shm.on_one_node(context(comm), options)


SPEC = Spec(prog="osu_allreduce", title="Allreduce Latency Test", collective="allreduce",
            algorithms=list(ALGORITHMS), buffers=_buffers,
            expected=_expected, call=_call, compressed=True, available=_available, mpi=_mpi)

#: Entry point (``argv`` defaults to the command line).
main = entry_point(SPEC)


if __name__ == "__main__":
    import sys

    from ..._runtime.cli import program

    sys.exit(program("osu_allreduce", main)())
