"""The gradient exchange of one sharded step alone, against data parallelism's, interleaved.

Run ``mpiexec -n 4 python bench/sharded_exchange.py [--rounds 5]``. The wide model's flat
gradient (64-4096-4096-10, 17.09 M float32 elements, cut into the shards of
``collectives.parallel.ShardPlan``) is averaged, each round, by every pattern of
:func:`_patterns` in turn, between barriers, with no computation in between:

- data parallelism: one ring allreduce;
- contiguous buckets (a range of the flat vector, mostly inside one shard: its ring
  reduce-scatter carries the whole bucket along the ring to one owner), blocking;
- balanced buckets (a slice of every shard side by side, as stage 1 stages them and stages 2-3
  compute them): blocking, or started on the progress engine with one or two in flight;

each reduce-scatter pattern followed by the parameters' allgather (stages 1-2). Rank 0 prints
each pattern's median over the rounds and its ratio to the allreduce. Bucket sizes are
fractions of a shard: ``/16`` is stage 2's blocking bucket, ``/32`` its pipelined one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

from collectives import allgather, allreduce, reduce_scatter
from collectives.engine.nonblocking import ireduce_scatter
from collectives.parallel import ShardPlan

SIZES = (64 * 4096 + 4096, 4096 * 4096 + 4096, 4096 * 10 + 10)


def _patterns(comm: MPI.Comm) -> dict[str, Callable[[], None]]:
    p, r = comm.size, comm.rank
    plan = ShardPlan(SIZES, p)
    n, off, largest = plan.total, plan.offsets, plan.largest
    g = np.random.default_rng(r).standard_normal(n).astype(np.float32)
    out = np.empty(n, np.float32)
    own = np.empty(plan.counts[r], np.float32)

    def gather() -> None:
        allgather(own.copy(), out=out, counts=plan.counts, algorithm="ring", comm=comm)

    def dp() -> None:
        allreduce(g, out=out, op="avg", algorithm="ring", comm=comm)

    def contiguous(share: int) -> Callable[[], None]:
        def run() -> None:
            for lo in range(0, n, largest // share):
                piece = plan.split(lo, min(n, lo + largest // share), r)
                reduce_scatter(g[piece.lo:piece.hi], out=own[piece.mine], op="avg",
                               counts=piece.counts, algorithm="ring", comm=comm)
            gather()
        return run

    def balanced(share: int, depth: int) -> Callable[[], None]:
        per = max(1, largest // share // p)
        staging = [np.empty(per * p, np.float32) for _ in range(depth + 1)]

        def run() -> None:
            reqs = []
            for k, a in enumerate(range(0, largest, per)):
                counts = [max(0, min(per, off[q + 1] - off[q] - a)) for q in range(p)]
                while depth and len(reqs) >= depth:
                    reqs.pop(0).wait()
                st, at = staging[k % len(staging)], 0
                for q, c in enumerate(counts):
                    st[at:at + c] = g[off[q] + a:off[q] + a + c]
                    at += c
                call = ireduce_scatter if depth else reduce_scatter
                req = call(st[:at], out=own[a:a + counts[r]], op="avg", counts=counts,
                           algorithm="ring", comm=comm)
                if depth:
                    reqs.append(req)
            for q in reqs:
                q.wait()
            gather()
        return run

    return {"data parallelism (allreduce)": dp,
            "contiguous /16, blocking": contiguous(16),
            "balanced /16, blocking": balanced(16, 0),
            "balanced /4, blocking": balanced(4, 0),
            "balanced /32, blocking": balanced(32, 0),
            "balanced /32, one in flight": balanced(32, 1),
            "balanced /16, two in flight": balanced(16, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    patterns = _patterns(comm)
    times: dict[str, list[float]] = {k: [] for k in patterns}
    for _ in range(a.rounds + 1):  # the first round compiles and is not counted
        for k, run in patterns.items():
            comm.Barrier()
            t0 = time.perf_counter()
            run()
            comm.Barrier()
            times[k].append(time.perf_counter() - t0)
    if comm.rank == 0:
        base = statistics.median(times["data parallelism (allreduce)"][1:])
        for k, v in times.items():
            m = statistics.median(v[1:])
            print(f"{k:32s} {m * 1e3:8.1f} ms  {m / base:.2f}x  "
                  f"rounds {[round(x * 1e3) for x in v[1:]]}")


if __name__ == "__main__":
    main()
