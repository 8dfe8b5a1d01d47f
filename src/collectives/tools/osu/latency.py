"""``osu_latency``: one-way latency between ranks 0 and 1 by ping-pong, OSU 7.x style.

Rank 0 sends S bytes to rank 1, which sends them back; the one-way latency is half the round
trip, averaged over the timed iterations (10000, 1000 above 8 KiB; warm-up 100 and 10, OSU's
defaults). ``--algorithm mpi`` (the default) sends through mpi4py's ``comm.Send``/``comm.Recv``,
``collectives`` through ``collectives.send``/``collectives.recv``, ``all`` both
(:mod:`.pt2pt`). :func:`pingpong` with mpi4py's calls is also what ``collectives-tune``
(:mod:`collectives.tools.tuning.fit`) fits alpha and beta from.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .options import Iterations
from .pt2pt import APIS, Api, run_pt2pt

__all__ = ["DEFAULTS", "pingpong", "main"]

DEFAULTS = Iterations(small=10000, warmup_small=100, large=1000, warmup_large=10)
TAG = 1


def pingpong(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, iterations: int,
             warmup: int, api: Api = APIS["mpi"]) -> float:
    """One-way latency in microseconds between ranks 0 and 1 (call on those two ranks only),
    with the messages of ``api`` (:data:`.pt2pt.APIS`)."""
    peer = 1 - comm.rank
    put, get = api.send, api.recv
    start = 0.0
    for it in range(warmup + iterations):
        if it == warmup:
            start = time.perf_counter()
        if comm.rank == 0:
            put(comm, send, peer, TAG)
            get(comm, recv, peer, TAG)
        else:
            get(comm, recv, peer, TAG)
            put(comm, recv, peer, TAG)
    return (time.perf_counter() - start) * 1e6 / (2 * max(iterations, 1))


def main(argv=None, comm=None, out=None):
    """Run ``osu_latency`` (``argv`` defaults to the command line); return its records."""
    return run_pt2pt("osu_latency", "Latency Test", "Latency (us)", pingpong, DEFAULTS,
                     argv, comm, out, latency=True)


if __name__ == "__main__":
    import sys

    from ..._runtime.cli import program

    sys.exit(program("osu_latency", main)())
