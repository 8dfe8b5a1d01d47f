"""A repeated ``allreduce(x, out=y)`` of the same PyTorch CPU tensors against the same call on
NumPy arrays, in one loop.

Run ``mpiexec -n 2 python bench/tensor_repeat.py [--sizes 8,4096,65536,1048576] [--calls 2000]
[--rounds 7] [--json FILE]``. For each size (float32, sum, default algorithm) both kinds are
remembered by a first call, then each round times ``--calls`` repeats of one kind, then of the
other (which goes first alternates), after a barrier; a round's time per call is the slowest
rank's. Rank 0 prints the median over rounds of each kind's time per call and their ratio
(tensors / NumPy): what a PyTorch user pays over a NumPy user for the same repeated call.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from mpi4py import MPI

import collectives
from collectives.tools.osu.options import parse_sizes


def _timed(fn, calls: int, comm: MPI.Comm) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return comm.allreduce((time.perf_counter() - t0) / calls, op=MPI.MAX)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=[8, 4096, 65536, 1 << 20])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="write the rows here (rank 0)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rows = []
    for nbytes in args.sizes:
        n = max(nbytes // 4, 1)
        x, y = np.ones(n, np.float32), np.empty(n, np.float32)
        t, u = torch.ones(n), torch.empty(n)
        kinds = {"numpy": lambda: collectives.allreduce(x, out=y),
                 "torch": lambda: collectives.allreduce(t, out=u)}
        calls = max(args.calls * 4096 // max(nbytes, 4096), 20)
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for fn in kinds.values():  # remembered by a first call, and warm
            _timed(fn, 5, comm)
        for r in range(args.rounds):
            for name in (list(kinds) if r % 2 == 0 else list(kinds)[::-1]):
                times[name].append(_timed(kinds[name], calls, comm))
        assert np.array_equal(y, np.full(n, comm.size, np.float32))
        assert torch.equal(u, torch.full((n,), float(comm.size)))
        med = {k: float(np.median(v)) for k, v in times.items()}
        rows.append({"bytes": nbytes, "numpy_us": med["numpy"] * 1e6,
                     "torch_us": med["torch"] * 1e6, "ratio": med["torch"] / med["numpy"]})
    if comm.rank == 0:
        print(f"# repeated allreduce(x, out=y), p = {comm.size}, float32, "
              f"{collectives.mpi_library()}: median of {args.rounds} rounds, slowest rank")
        print(f"{'bytes':>9} {'numpy us':>10} {'torch us':>10} {'torch/numpy':>12}")
        for row in rows:
            print(f"{row['bytes']:>9} {row['numpy_us']:>10.2f} {row['torch_us']:>10.2f} "
                  f"{row['ratio']:>11.2f}x")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": comm.size, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
