"""``osu_bw``: streaming bandwidth from rank 0 to rank 1, OSU 7.x style.

Rank 0 posts a window of 64 non-blocking sends of S bytes, rank 1 the matching receives; after
each window rank 1 returns a 4-byte acknowledgement. Bandwidth = S x 64 x iterations / time in
MB/s (1e6 bytes). OSU's defaults: 100 timed and 10 warm-up windows, 20 and 2 above 8 KiB.
``--algorithm mpi`` (the default) streams through mpi4py's ``comm.Isend``/``comm.Irecv``,
``collectives`` through ``collectives.isend``/``collectives.irecv`` (each request waited),
``all`` both (:mod:`.pt2pt`).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .options import Iterations
from .pt2pt import APIS, Api, run_pt2pt

__all__ = ["DEFAULTS", "WINDOW", "stream", "main"]

DEFAULTS = Iterations(small=100, warmup_small=10, large=20, warmup_large=2)
WINDOW = 64
TAG, ACK_TAG = 2, 3


def stream(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, iterations: int,
           warmup: int, api: Api = APIS["mpi"]) -> float:
    """Bandwidth in MB/s from rank 0 to rank 1 (call on those two ranks only), with the
    messages of ``api`` (:data:`.pt2pt.APIS`)."""
    ack = np.zeros(4, np.uint8)
    start = 0.0
    for it in range(warmup + iterations):
        if it == warmup:
            start = time.perf_counter()
        if comm.rank == 0:
            api.waitall([api.isend(comm, send, 1, TAG) for _ in range(WINDOW)])
            api.recv(comm, ack, 1, ACK_TAG)
        else:
            api.waitall([api.irecv(comm, recv, 0, TAG) for _ in range(WINDOW)])
            api.send(comm, ack, 0, ACK_TAG)
    elapsed = time.perf_counter() - start
    return send.nbytes * WINDOW * iterations / 1e6 / elapsed if elapsed > 0 else 0.0


def main(argv=None, comm=None, out=None):
    """Run ``osu_bw`` (``argv`` defaults to the command line); return its records."""
    return run_pt2pt("osu_bw", "Bandwidth Test", "Bandwidth (MB/s)", stream, DEFAULTS,
                     argv, comm, out, latency=False)


if __name__ == "__main__":
    import sys

    from ..._runtime.cli import program

    sys.exit(program("osu_bw", main)())
