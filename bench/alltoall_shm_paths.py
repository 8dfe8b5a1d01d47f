"""The shm alltoall's two paths side by side: through the slots and by cross-memory attach.

Run ``mpiexec -n P python bench/alltoall_shm_paths.py [--sizes 4096,8192,16384,262144]
[--rounds 40]``. For each size (bytes per block, float32) it times a bare ``comm.Alltoall``,
the default ``collectives.alltoall`` and ``algorithm="shm"`` with ``Options.shm_cma_bytes``
set to never ("slots") and to 0 ("cma"), each repeated on the same arrays, in batches of a few
calls (about 2 ms of the bare call, at most 200) after a barrier; rank 0 prints the fastest
batch's time per call of the slowest rank, and its ratio to the bare call: on a machine shared
with other jobs the fastest round is the one no other job preempted. It is what sets
``CMA_BLOCK_BYTES`` (``algorithms/shm_alltoall.py``; docs/benchmarks/alltoall.md).
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import collectives
from collectives.tools.osu.options import parse_sizes

from alltoall_sweep import _timed  # the sibling script's (bench/ is sys.path[0])

PATHS = {"slots": collectives.Options(shm_cma_bytes=1 << 62),
         "cma": collectives.Options(shm_cma_bytes=0)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=[4096, 8192, 16384, 262144])
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    p = comm.size
    bare = comm.Dup()
    for nbytes in args.sizes:
        x = np.ones(max(nbytes // 4, 1) * p, np.float32)
        ys = {k: np.empty_like(x) for k in ("comm.Alltoall", "default", *PATHS)}
        fns = {"comm.Alltoall": lambda: bare.Alltoall(x, ys["comm.Alltoall"]),
               "default": lambda: collectives.alltoall(x, out=ys["default"])}
        for name, opts in PATHS.items():
            fns[name] = (lambda name=name, opts=opts: collectives.alltoall(
                x, out=ys[name], algorithm="shm", options=opts))
        for fn in fns.values():
            _timed(fn, 3, comm)
        calls = max(3, min(200, int(0.002 / _timed(fns["comm.Alltoall"], 5, comm))))
        times = {k: [] for k in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                times[name].append(_timed(fn, calls, comm))
        if comm.rank == 0:
            best = {k: min(v) * 1e6 for k, v in times.items()}
            print(f"{nbytes:>9} B {calls:>4} calls  " + "  ".join(
                f"{k} {v:8.2f} us ({v / best['comm.Alltoall']:.2f}x)" for k, v in best.items()),
                flush=True)
    bare.Free()


if __name__ == "__main__":
    main()
