"""Sharded data parallelism's step against data parallelism's, in one launch, interleaved.

Run ``mpiexec -n 4 python bench/sharded_step.py [--rounds 5] [--json FILE] [-- DRIVER ARGS]``
(driver arguments default to ``--model wide --epochs 1 --quiet``). Each round trains one run of
every configuration of :data:`CONFIGS` in turn (the order rotates from round to round): data
parallelism, and stages 2 and 3 with the bucket layouts and schedules of
``collectives.sgd.sync.sharded`` (``BALANCED``: a bucket made of a block of rows of every
owner's part of a layer, else consecutive rows; ``PIPELINED``: each bucket's reduce-scatter on
the progress engine while backward computes the next, else blocking). It records the slowest
rank's median step of the run; rank 0 prints, per configuration, the median over rounds and its
ratio to data parallelism's (after one untimed run of each on a small model, which compiles
the kernels). Every configuration ends with the same parameters (dense, ring:
docs/sharded.md), which the script checks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np
from mpi4py import MPI

from collectives.sgd import datasets
from collectives.sgd.cli import parse
from collectives.sgd.driver import Trainer
from collectives.sgd.sync import sharded

#: name -> (extra driver arguments, BALANCED, PIPELINED)
CONFIGS = {
    "data parallelism": ([], True, True),
    "stage 2, contiguous, blocking": (["--shard", "2"], False, False),
    "stage 2, balanced, blocking": (["--shard", "2"], True, False),
    "stage 2, balanced, pipelined": (["--shard", "2"], True, True),
    "stage 3, contiguous, blocking": (["--shard", "3"], False, False),
    "stage 3, balanced, pipelined": (["--shard", "3"], True, True),
    "stage 3, balanced, blocking": (["--shard", "3"], True, False),
}


def _run(argv: list[str], comm: MPI.Comm, balanced: bool, pipelined: bool) -> tuple[float, bytes]:
    """The slowest rank's median step of one run, and the final parameters' bytes."""
    sharded.BALANCED, sharded.PIPELINED = balanced, pipelined
    pre = parse(argv, comm.size, 10**12)
    ds = datasets.load(pre.args.dataset, pre.args.subset)
    t = Trainer(parse(argv, comm.size, len(ds.y_train)), ds, comm)
    t.t_start = 0.0
    t.train()
    t.exchange.close()
    full = t.exchange.full_params()
    median = comm.allreduce(float(np.median(t.step_seconds)), op=MPI.MAX)
    return median, comm.bcast(None if full is None else full.tobytes(), root=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", help="comma-separated configuration numbers (0-based) to run")
    ap.add_argument("--json")
    ap.add_argument("driver", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    base = [x for x in a.driver if x != "--"] or ["--model", "wide", "--epochs", "1", "--quiet"]
    comm = MPI.COMM_WORLD
    names = list(CONFIGS) if not a.only else [list(CONFIGS)[int(i)] for i in a.only.split(",")]
    times: dict[str, list[float]] = {k: [] for k in names}
    bits = set()
    for k in names:  # compile the kernels every configuration calls, on a small model
        _run(["--hidden", "16", "--subset", "128", "--epochs", "1", "--quiet", *CONFIGS[k][0]],
             comm, *CONFIGS[k][1:])
    for r in range(a.rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            extra, balanced, pipelined = CONFIGS[k]
            comm.Barrier()
            median, params = _run([*base, *extra], comm, balanced, pipelined)
            times[k].append(median)
            bits.add(params)
            if comm.rank == 0:
                print(f"round {r}: {k}: {median * 1e3:.1f} ms", file=sys.stderr, flush=True)
    if comm.rank == 0:
        dp = statistics.median(times["data parallelism"])
        rows = {k: {"median_ms": statistics.median(v) * 1e3,
                    "ratio": statistics.median(v) / dp, "runs_ms": [x * 1e3 for x in v]}
                for k, v in times.items()}
        for k, row in rows.items():
            print(f"{k:32s} {row['median_ms']:8.1f} ms  {row['ratio']:.2f}x  "
                  f"runs {[round(x) for x in row['runs_ms']]}")
        print(f"same parameters in every run: {len(bits) == 1}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"world": comm.size, "driver": base, "configs": rows,
                           "same_bits": len(bits) == 1}, f, indent=1)


if __name__ == "__main__":
    main()
