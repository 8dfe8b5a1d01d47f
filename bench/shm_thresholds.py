"""Where the shared-memory allreduce should switch from its slots to cross-memory attach.

Usage::

    mpiexec -n 2 python bench/shm_thresholds.py [--in-place] [--sizes 256K,1M,...] [--json F]

On one communicator's ``shm`` team it times three columns interleaved, round after round
(medians of 7 rounds; each round runs a column's calls back to back after a barrier): ``mpi``
(mpi4py's bare ``comm.Allreduce`` on a duplicate of the world, outside the library), ``cma``
(``collectives.allreduce(algorithm="shm")`` with the team's threshold set to 0 bytes: cross-memory
attach at every size the kernel allows) and ``slots`` (the threshold set to never: staged through
the window's slots). Every rank sets the same threshold before each call, as the team's creation
does (``_runtime/shmem/team.py``, ``T_CMA``). Float32 sum, out of place unless ``--in-place``.
The team's own threshold is restored at the end. docs/benchmarks/shm.md, "shm thresholds".
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives._runtime.context import context
from collectives._runtime.shmem import layout
from collectives.algorithms import shm
from collectives.tools.osu.options import parse_sizes

DEFAULT_SIZES = "256K,512K,1M,2M,4M,8M,16M,64M"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"bytes (default {DEFAULT_SIZES})")
    ap.add_argument("--in-place", action="store_true", help="allreduce(x, out=x)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="write the medians (us) to this file")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    bare = comm.Dup()
    collectives.allreduce(np.ones(16, np.float32), algorithm="shm")
    team = shm.team(context(comm), collectives.Options.from_env())
    saved, never = int(team.tab[layout.T_CMA]), np.iinfo(np.int64).max
    rows = []
    try:
        for nbytes in parse_sizes(args.sizes):
            x = np.ones(max(nbytes // 4, 1), np.float32)
            y = x if args.in_place else np.empty_like(x)

            def run(threshold: int) -> None:
                team.tab[layout.T_CMA] = threshold
                collectives.allreduce(x, out=y, algorithm="shm")

            columns = {"mpi": lambda: bare.Allreduce(MPI.IN_PLACE if y is x else x, y),
                       "cma": lambda: run(0), "slots": lambda: run(never)}
            calls = max(3, int(2e8 // nbytes // 10))
            times: dict[str, list[float]] = {k: [] for k in columns}
            for f in columns.values():
                f()
            for _ in range(args.rounds):
                for name, f in columns.items():
                    comm.Barrier()
                    t = time.perf_counter()
                    for _ in range(calls):
                        f()
                    times[name].append((time.perf_counter() - t) / calls * 1e6)
            rows.append({"bytes": nbytes, **{k: float(np.median(v)) for k, v in times.items()}})
    finally:
        team.tab[layout.T_CMA] = saved
    if comm.rank:
        return
    print(f"# p={comm.size}, {'in place' if args.in_place else 'out of place'}, median us per "
          "call (ratio to mpi)")
    print(f"{'bytes':>10} {'mpi':>10} {'cma':>16} {'slots':>16}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['mpi']:>10.1f} " + " ".join(
            f"{r[k]:>9.1f} ({r[k] / r['mpi']:.2f})" for k in ("cma", "slots")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": comm.size, "in_place": args.in_place, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
