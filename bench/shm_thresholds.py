"""Where the shared-memory allreduce should switch from its slots to cross-memory attach.

Usage::

    mpiexec -n 2 python bench/shm_thresholds.py [--in-place] [--sizes 256K,1M,...] [--json F]

On one communicator it times three columns interleaved, round after round
(medians of 7 rounds; each round runs a column's calls back to back after a barrier): ``mpi``
(mpi4py's bare ``comm.Allreduce`` on a duplicate of the world, outside the library), ``cma``
(``collectives.allreduce(algorithm="shm")`` with ``Options(shm_cma_bytes=0)``: cross-memory
attach at every size the kernel allows) and ``slots`` (``shm_cma_bytes`` above any size: staged
through the window's slots). The two settings make two teams of the communicator, a shared
window each, both made and warmed up before the first round. The other options come from the
environment. Float32 sum, out of place unless ``--in-place``. docs/benchmarks/shm.md, "shm
thresholds".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives.tools.osu.options import parse_sizes

DEFAULT_SIZES = "256K,512K,1M,2M,4M,8M,16M,64M"
#: ``Options.shm_cma_bytes`` above any call: the slots at every size
NEVER = 2**63 - 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"bytes (default {DEFAULT_SIZES})")
    ap.add_argument("--in-place", action="store_true", help="allreduce(x, out=x)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="write the medians (us) to this file")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    bare = comm.Dup()
    env = collectives.Options.from_env()
    settings = {"cma": dataclasses.replace(env, shm_cma_bytes=0),
                "slots": dataclasses.replace(env, shm_cma_bytes=NEVER)}
    rows = []
    for nbytes in parse_sizes(args.sizes):
        x = np.ones(max(nbytes // 4, 1), np.float32)
        y = x if args.in_place else np.empty_like(x)
        columns = {"mpi": lambda: bare.Allreduce(MPI.IN_PLACE if y is x else x, y)}
        for name, opts in settings.items():
            columns[name] = lambda opts=opts: collectives.allreduce(x, out=y, algorithm="shm",
                                                                    options=opts)
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
