"""``osu_bcast``: latency of broadcast from rank 0 (``collectives.bcast``, in place).

Rank 0 holds :func:`pattern`; the buffer is broadcast in place, so ``out`` is the input buffer
itself. Bus bandwidth ``S / t`` (nccl-tests).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ... import api
from ...blocks import BCAST
from ...options import Options
from .collective import Buffers, Spec, entry_point, pattern

__all__ = ["SPEC", "main"]


def _buffers(count: int, dtype: np.dtype, comm: MPI.Comm) -> Buffers:
    x = pattern(count, dtype, 0) if comm.rank == 0 else np.zeros(count, dtype)
    return Buffers(x, x)


def _expected(count: int, dtype: np.dtype, comm: MPI.Comm) -> np.ndarray:
    return pattern(count, dtype, 0)


def _call(algorithm: str, b: Buffers, comm: MPI.Comm, options: Options) -> None:
    api.bcast(b.out, root=0, algorithm=algorithm, comm=comm, options=options)


def _mpi(b: Buffers, comm: MPI.Comm) -> None:
    comm.Bcast(b.out, root=0)


SPEC = Spec(prog="osu_bcast", title="Broadcast Latency Test", collective="bcast",
            algorithms=list(BCAST), buffers=_buffers, expected=_expected, call=_call,
            default_algorithm="binomial", mpi=_mpi)

#: Entry point (``argv`` defaults to the command line).
main = entry_point(SPEC)


if __name__ == "__main__":
    import sys

    from ..._runtime.cli import program

    sys.exit(program("osu_bcast", main)())
