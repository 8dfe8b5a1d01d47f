"""``osu_alltoallv``: latency of alltoall with counts (``collectives.alltoall(x, counts=...)``).

As OSU's ``osu_alltoallv``, every block has the size S (the v path is what is timed: counts,
displacements, the receive counts learned from the peers), so its rows read beside
``osu_alltoall``'s; the data are the same blocks (:func:`.alltoall.block`). The library's v form
returns the receive counts it learns from the other ranks (Horovod's received splits), so the
``mpi`` column does what a user of mpi4py does for the same result: ``comm.Alltoall`` of the
send counts, then ``comm.Alltoallv`` with both. Bus bandwidth as ``osu_alltoall``'s.
``--algorithm`` names an entry of :data:`collectives.ALLTOALL` that takes ``counts=`` (not
``bruck``; default ``auto``), ``mpi`` or ``all``.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ... import api
from ...algorithms import ALLTOALL, EQUAL_BLOCKS_ONLY
from ...options import Options
from .alltoall import buffers, expected
from .collective import Buffers, Spec, entry_point

__all__ = ["SPEC", "main"]


def _call(algorithm: str, b: Buffers, comm: MPI.Comm, options: Options) -> None:
    counts = [b.x.size // comm.size] * comm.size
    api.alltoall(b.x, out=b.out, counts=counts, algorithm=algorithm, comm=comm, options=options)


def _mpi(b: Buffers, comm: MPI.Comm) -> None:
    sent = np.full(comm.size, b.x.size // comm.size, dtype=np.int32)
    got = np.empty_like(sent)
    comm.Alltoall(sent, got)
    comm.Alltoallv([b.x, sent], [b.out, got])


SPEC = Spec(prog="osu_alltoallv", title="All-to-Allv Personalized Exchange Latency Test",
            collective="alltoall",
            algorithms=[a for a in ALLTOALL if a not in EQUAL_BLOCKS_ONLY], buffers=buffers,
            expected=expected, call=_call, bus_bytes=lambda size, p: size * p, mpi=_mpi)

#: Entry point (``argv`` defaults to the command line).
main = entry_point(SPEC)


if __name__ == "__main__":
    import sys

    from ..._runtime.cli import program

    sys.exit(program("osu_alltoallv", main)())
