"""Soak test of the non-blocking collectives: many random operations, memory and leaks checked.

``mpiexec -n 4 python bench/soak_nonblocking.py [--ops 10000] [--seed 0]``

Every rank draws the same random sequence of operations (iallreduce with every algorithm,
ireduce_scatter, iallgather, ibcast, ireduce, persistent plans; sizes 0 .. 64 KiB; float32,
float64, int32; on COMM_WORLD, a split and a duplicate), keeps up to 32 in flight and waits for
random subsets of them in a per-rank random order; every result is checked against the known
answer. After the first tenth of the operations (pools, engines and caches warm) the resident
set size is read (``VmRSS``), and again at the end; then the communicators are freed.

Pass criteria (printed, and the exit status): RSS growth below 1 %, every request completed and
none outstanding on any engine, no engine left alive but COMM_WORLD's, and no thread left but
the main one and COMM_WORLD's engine.
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives.engine import live_engines


def rss_bytes() -> int:
    """Resident set size now (Linux ``/proc``), else the peak from ``getrusage``."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _submit(kind, comm, n, dtype, rng):
    """Start one operation; return (request, check) where check(result) asserts the answer."""
    p, r = comm.size, comm.rank
    x = np.full(n * p, r + 1, dtype=dtype)
    total = p * (p + 1) // 2
    if kind == "allreduce":
        algorithm = str(rng.choice(list(collectives.ALGORITHMS)))
        req = collectives.iallreduce(x, algorithm=algorithm, comm=comm)
        return req, lambda y: np.all(y == total)
    if kind == "reduce_scatter":
        req = collectives.ireduce_scatter(x, comm=comm, algorithm=str(rng.choice(["ring", "native"])))
        return req, lambda y: y.size == n and np.all(y == total)
    if kind == "allgather":
        req = collectives.iallgather(x, comm=comm)
        return req, lambda y: np.array_equal(y, np.repeat(np.arange(1, p + 1), n * p).astype(dtype))
    if kind == "bcast":
        req = collectives.ibcast(x, root=p - 1, comm=comm)
        return req, lambda y: np.all(y == p)
    req = collectives.ireduce(x, root=0, comm=comm)
    return req, lambda y: (y is None) if r != 0 else np.all(y == total)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--in-flight", type=int, default=32)
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    comms = [world, world.Split(world.rank % 2, world.rank), world.Dup()]
    rng = np.random.default_rng(args.seed)          # the same on every rank
    order = np.random.default_rng(1000 + world.rank)  # waiting order: per rank
    kinds = ["allreduce", "allreduce", "reduce_scatter", "allgather", "bcast", "reduce"]
    plans = []
    for comm in comms:
        x = np.full(5, comm.rank + 1.0)
        plans.append((collectives.allreduce_init(x, comm=comm), comm.size * (comm.size + 1) / 2))
    in_flight: list = []
    bad = 0
    warm_at = max(1, args.ops // 10)
    rss_warm = 0
    start = time.perf_counter()
    for i in range(args.ops):
        if i == warm_at:
            collectives.waitall([req for req, _ in in_flight])
            rss_warm = rss_bytes()
        comm = comms[int(rng.integers(len(comms)))]
        if rng.random() < 0.1:  # a persistent plan
            plan, expected = plans[comms.index(comm)]
            if plan.test():
                bad += not np.all(plan() == expected)
            continue
        n = int(rng.choice([0, 1, 3, 100, 2048]))
        dtype = np.dtype(str(rng.choice(["float32", "float64", "int32"])))
        in_flight.append(_submit(str(rng.choice(kinds)), comm, n, dtype, rng))
        if len(in_flight) >= args.in_flight:
            order.shuffle(in_flight)
            done, in_flight = in_flight[:args.in_flight // 2], in_flight[args.in_flight // 2:]
            for req, check in done:
                bad += not check(req.wait())
    for req, check in in_flight:
        bad += not check(req.wait())
    elapsed = time.perf_counter() - start
    rss_end = rss_bytes()
    outstanding = sum(len(e.outstanding()) for e in live_engines())
    for comm in comms[1:]:
        comm.Free()
    time.sleep(0.2)
    engines = len(live_engines())
    threads = threading.active_count()
    growth = 100.0 * (rss_end - rss_warm) / rss_warm
    ok = bad == 0 and outstanding == 0 and engines <= 1 and threads <= 2 and growth < 1.0
    rows = world.gather((world.rank, bad, outstanding, engines, threads, rss_warm, rss_end, growth))
    if world.rank == 0:
        print(f"# {args.ops} operations on {world.size} ranks in {elapsed:.1f} s "
              f"({args.ops / elapsed:.0f} per second per rank)")
        print("rank  wrong  outstanding  engines  threads   RSS after warm-up  RSS at end  growth")
        for r, b, o, e, t, w, f, g in rows:
            print(f"{r:4d}  {b:5d}  {o:11d}  {e:7d}  {t:7d}  {w / 2**20:14.1f} MiB  "
                  f"{f / 2**20:7.1f} MiB  {g:5.2f}%")
    everyone = world.allreduce(int(ok), op=MPI.MIN)
    if world.rank == 0:
        print("PASS" if everyone else "FAIL")
    return 0 if everyone else 1


if __name__ == "__main__":
    sys.exit(main())
