"""``osu_barrier``: latency of barrier (``collectives.barrier``), OSU Micro-Benchmarks 7.x style.

A barrier moves no data: as OSU's ``osu_barrier`` prints, there is no size column, one row of
latencies (``-m``/``--sizes`` are ignored). ``--algorithm`` names an entry of
:data:`collectives.BARRIER` (default ``auto``), ``mpi`` (``comm.Barrier`` from mpi4py) or
``all``. The timing loop is the collectives' (:mod:`.timing`): each call timed alone, then an
untimed ``MPI_Barrier``.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ... import api
from ...algorithms import BARRIER
from ...options import Options
from .collective import Buffers, Spec, entry_point

__all__ = ["SPEC", "main"]


def _buffers(count: int, dtype: np.dtype, comm: MPI.Comm) -> Buffers:
    x = np.zeros(0, dtype)
    return Buffers(x, x)


def _expected(count: int, dtype: np.dtype, comm: MPI.Comm) -> np.ndarray:
    return np.zeros(0, dtype)


def _call(algorithm: str, b: Buffers, comm: MPI.Comm, options: Options) -> None:
    api.barrier(algorithm=algorithm, comm=comm, options=options)


def _mpi(b: Buffers, comm: MPI.Comm) -> None:
    comm.Barrier()


SPEC = Spec(prog="osu_barrier", title="Barrier Latency Test", collective="barrier",
            algorithms=list(BARRIER), buffers=_buffers, expected=_expected, call=_call,
            bus_bytes=lambda size, p: 0, sized=False, mpi=_mpi)

#: Entry point (``argv`` defaults to the command line).
main = entry_point(SPEC)


if __name__ == "__main__":
    import sys

    from ..._runtime.cli import program

    sys.exit(program("osu_barrier", main)())
