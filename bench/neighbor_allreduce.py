"""One gossip round against one allreduce: ``neighbor_allreduce`` on both backends and bare MPI.

Run e.g. ``mpiexec -n 4 python bench/neighbor_allreduce.py --sizes 4K,256K,4M --json out.json``.
For each size (float32) and each graph (``--graphs``, default ring and one-peer exponential) it
times ``collectives.neighbor_allreduce`` with ``backend="p2p"`` (the library's guarded messages)
and ``backend="mpi"`` (``MPI_Ineighbor_allgather`` on a distributed-graph communicator), and
mpi4py's bare ``comm.Allreduce`` (the average a user would otherwise take) and the library's ring
allreduce (``algorithm="ring"``, the bandwidth-optimal allreduce a gossip round is held against
on a network), interleaved: every
iteration runs each variant once, after a barrier, so load drifts hit all of them alike. A
variant's time per iteration is the slowest rank's; the table gives the median over
``--iterations`` (after ``--warmup``) and its ratio to ``comm.Allreduce``'s median. The one-peer
graph gets the iteration as its step (it changes every round). Every variant's first result is
checked against the plain reference (``W @ X`` of every rank's vector). Rank 0 prints the table
and, with ``--json``, writes it with the load average (1 minute) before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives.decentralized import topology as T
from collectives.tools.osu.options import parse_sizes


def _variants(graphs: list[T.Topology], comm: MPI.Comm) -> dict:
    """name -> fn(x, out, iteration)."""
    out: dict = {}
    for t in graphs:
        for backend in collectives.decentralized.neighbor.BACKENDS:
            out[f"{t.name.split('(')[0]} {backend}"] = (
                lambda x, y, i, t=t, b=backend:
                collectives.neighbor_allreduce(x, t, out=y, step=i, comm=comm, backend=b), t)
    out["comm.Allreduce"] = (lambda x, y, i: comm.Allreduce(x, y, op=MPI.SUM), None)
    out["allreduce ring"] = (lambda x, y, i: collectives.allreduce(x, out=y, algorithm="ring",
                                                                 comm=comm), None)
    return out


def _check(name: str, y: np.ndarray, x: np.ndarray, t: T.Topology | None, comm: MPI.Comm,
           step: int) -> None:
    rows = np.array(comm.allgather(float(x[0])))
    expected = rows.sum() if t is None else t.weights(step)[comm.rank] @ rows
    if not np.allclose(y, expected, rtol=1e-5):
        raise SystemExit(f"neighbor_allreduce.py: {name} gave {y[0]}, expected {expected}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=[4 << 10, 256 << 10, 4 << 20])
    ap.add_argument("--graphs", default="ring,one_peer_exponential",
                    help="comma-separated names of collectives.topology.GRAPHS")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", metavar="PATH", help="write the medians here (rank 0)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    graphs = [T.parse(g, comm.size) for g in args.graphs.split(",")]
    variants = _variants(graphs, comm)
    load = os.getloadavg()[0]
    records = []
    for nbytes in args.sizes:
        x = np.full(max(nbytes // 4, 1), float(comm.rank + 1), np.float32)
        y = np.empty_like(x)
        times = {name: [] for name in variants}
        for i in range(args.warmup + args.iterations):
            for name, (fn, t) in variants.items():
                comm.Barrier()
                t0 = time.perf_counter()
                fn(x, y, i)
                dt = time.perf_counter() - t0
                if i == 0:
                    _check(name, y, x, t, comm, i)
                if i >= args.warmup:
                    times[name].append(dt)
        row = {"bytes": x.nbytes}
        for name, ts in times.items():
            slowest = np.empty(len(ts))
            comm.Allreduce(np.array(ts), slowest, op=MPI.MAX)
            row[name] = float(np.median(slowest)) * 1e6
        records.append(row)
    if comm.rank:
        return
    names = list(variants)
    print(f"# neighbor_allreduce against comm.Allreduce, p = {comm.size}, float32, median of "
          f"{args.iterations} (slowest rank), microseconds (x: ratio to comm.Allreduce)")
    print(f"{'bytes':>10}  " + "  ".join(f"{n:>26}" for n in names))
    for r in records:
        base = r["comm.Allreduce"]
        print(f"{r['bytes']:>10}  " + "  ".join(
            f"{r[n]:>16.1f} ({r[n] / base:5.2f}x)" for n in names))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": comm.size, "iterations": args.iterations,
                       "load_before": load, "load_after": os.getloadavg()[0],
                       "unit": "microseconds, median of the slowest rank", "rows": records},
                      f, indent=1)


if __name__ == "__main__":
    main()
