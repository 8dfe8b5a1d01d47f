"""Every pair of ranks in turn: ``osu_bw --matrix`` and ``osu_latency --matrix``.

OSU's point-to-point tests measure ranks 0 and 1 only. On a cluster the interesting question is
how each pair of ranks is connected: two ranks of one node share memory, two ranks of different
nodes cross the network. The matrix mode runs the same measurement (the ``osu_bw`` window, the
``osu_latency`` ping-pong) between every ordered pair ``(i, j)`` in turn, ``i`` sending first,
while every other rank waits at a barrier, so pairs never compete for a link. Row ``i``, column
``j`` of the printed matrix is the result from ``i`` to ``j``; rows and columns are labelled
``rank@host`` (``MPI.Get_processor_name``).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from mpi4py import MPI

__all__ = ["pair_comm", "measure_pairs", "format_matrix"]

#: ``measure(comm, send, recv, iterations, warmup)`` on a 2-rank communicator -> one number
Measure = Callable[[MPI.Comm, np.ndarray, np.ndarray, int, int], float]


def pair_comm(comm: MPI.Comm, i: int, j: int) -> MPI.Comm:
    """A communicator of ranks ``i`` (its rank 0) and ``j`` (rank 1); COMM_NULL elsewhere
    (collective over ``comm``)."""
    member = comm.rank in (i, j)
    return comm.Split(0 if member else MPI.UNDEFINED, 0 if comm.rank == i else 1)


def measure_pairs(comm: MPI.Comm, measure: Measure, send: np.ndarray, recv: np.ndarray,
                  iterations: int, warmup: int) -> np.ndarray:
    """``p x p`` matrix of ``measure`` from rank ``i`` (row) to rank ``j`` (column), NaN on the
    diagonal; the same matrix on every rank."""
    p = comm.size
    out = np.full((p, p), math.nan)
    for i in range(p):
        for j in range(p):
            if i == j:
                continue
            pair = pair_comm(comm, i, j)
            value = 0.0
            if pair != MPI.COMM_NULL:
                value = measure(pair, send, recv, iterations, warmup)
                pair.Free()
            out[i, j] = comm.bcast(value, root=i)
            comm.Barrier()
    return out


def format_matrix(matrix: np.ndarray, labels: Sequence[str], width: int = 12) -> list[str]:
    """The matrix as text: a ``#`` header of column labels, then one row per sender."""
    first = max(len(s) for s in labels) + 2
    head = "#" + " " * (first - 1) + "".join(f"{s:>{width}}" for s in labels)
    rows = []
    for label, values in zip(labels, matrix):
        cells = "".join(f"{'-':>{width}}" if math.isnan(v) else f"{v:>{width}.2f}" for v in values)
        rows.append(f"{label:<{first}}{cells}")
    return [head, *rows]
