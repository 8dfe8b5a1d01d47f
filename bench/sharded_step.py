"""Sharded data parallelism's step against data parallelism's, in one launch, interleaved.

Run ``mpiexec -n 4 python bench/sharded_step.py [--rounds 5] [--json FILE] [-- DRIVER ARGS]``
(driver arguments default to ``--model wide --epochs 1 --quiet``). Each round trains one run of
every configuration of :data:`CONFIGS` in turn (the order rotates from round to round): data
parallelism, stage 1, and stages 2 and 3 with the bucket layouts and schedules of
``collectives.sgd.sync.sharded`` (``BALANCED``: a bucket made of a block of rows of every
owner's part of a layer, else consecutive rows; ``PIPELINED``: each bucket's reduce-scatter on
the progress engine while backward computes the next, else blocking; ``BUCKET_SHARE``: a
bucket's largest share of a shard; ``PER_BUCKET``: each bucket's slices of the shard updated
as their average lands, where a bucket with the block it lands in takes at most
1/``BUCKET_SHARE`` of a shard), with and without compression. The configurations without
``PER_BUCKET`` run as the driver ran before it (the averaged shard kept whole, ``BUCKET_SHARE``
16 unless given). It records the slowest
rank's median step of the run, its peak memory per category (the largest rank's, from the
driver's ledger; "buffers" reads the collectives' scratch, which the process keeps from one
run to the next), the bytes it sent per step and where a step's time went (``split_ms``:
the driver's compute, its exchange and, inside the exchange, the codec's encode, decode and
sparse sum, per step, the mean over the ranks; the median over the rounds), and writes them
after every round; rank 0
prints, per configuration, the median over rounds and its ratio to data parallelism's (after
one untimed run of each on a small model, which compiles the kernels). Every configuration
without a codec (neither ``--codec`` nor ``--param-codec``) ends with the same parameters (dense, ring: docs/sharded.md), which the script
checks; each run's line ends with a digest of its final parameters (the first 12 hex digits of
their SHA-1), so that a failed check names the runs that differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys

import numpy as np
from mpi4py import MPI

from collectives.observe import OBSERVERS
from collectives.sgd import datasets
from collectives.sgd.cli import parse
from collectives.sgd.driver import Trainer, limit_threads
from collectives.sgd.sync import sharded

_TOPK = ["--codec", "topk:ratio=0.01", "--error-feedback"]
_BF16 = ["--param-codec", "bf16"]

#: name -> (extra driver arguments, BALANCED, PIPELINED[, BUCKET_SHARE[, PER_BUCKET]]) (16 and
#: False when left out: the driver before the per-bucket update); a configuration with a codec is
#: left out of the check that every run ends with the same parameters
CONFIGS = {
    "data parallelism": ([], True, True),
    "stage 1": (["--shard", "1"], False, False),
    "stage 2, contiguous, blocking": (["--shard", "2"], False, False),
    "stage 2, balanced, blocking": (["--shard", "2"], True, False),
    "stage 2, balanced, pipelined": (["--shard", "2"], True, True),
    "stage 3, contiguous, blocking": (["--shard", "3"], False, False),
    "stage 3, balanced, pipelined": (["--shard", "3"], True, True),
    "stage 3, balanced, blocking": (["--shard", "3"], True, False),
    "stage 2, contiguous, pipelined": (["--shard", "2"], False, True),
    "stage 2, top-k 1 % + EF": (["--shard", "2", "--codec", "topk:ratio=0.01",
                                 "--error-feedback"], False, False),
    "stage 3, top-k 1 % + EF, bf16 parameters": (
        ["--shard", "3", "--codec", "topk:ratio=0.01", "--error-feedback",
         "--param-codec", "bf16"], False, False),
    "stage 2, balanced, blocking, buckets of 1/4 shard": (["--shard", "2"], True, False, 4),
    "stage 3, balanced, blocking, buckets of 1/4 shard": (["--shard", "3"], True, False, 4),
    "stage 2, top-k 1 % + EF, bf16 parameters": (
        ["--shard", "2", "--codec", "topk:ratio=0.01", "--error-feedback",
         "--param-codec", "bf16"], False, False),
    "stage 2, balanced, pipelined, buckets of 1/4 shard": (["--shard", "2"], True, True, 4),
    "stage 3, balanced, pipelined, buckets of 1/4 shard": (["--shard", "3"], True, True, 4),
    "stage 2, balanced, pipelined, buckets of 1/8 shard": (["--shard", "2"], True, True, 8),
    "stage 2, balanced, blocking, buckets of 1/11 shard": (["--shard", "2"], True, False, 11),
    "stage 3, balanced, blocking, buckets of 1/11 shard": (["--shard", "3"], True, False, 11),
    "stage 2, balanced, blocking, buckets of a shard": (["--shard", "2"], True, False, 1),
    "stage 2, balanced, pipelined, buckets of a shard": (["--shard", "2"], True, True, 1),
    # the per-bucket update (PER_BUCKET): a bucket and the block it lands in within a shard
    "stage 2, per-bucket, balanced, blocking": (["--shard", "2"], True, False, 1, True),
    "stage 2, per-bucket, balanced, pipelined": (["--shard", "2"], True, True, 1, True),
    "stage 2, per-bucket, contiguous, blocking": (["--shard", "2"], False, False, 1, True),
    "stage 3, per-bucket, balanced, blocking": (["--shard", "3"], True, False, 1, True),
    "stage 3, per-bucket, balanced, pipelined": (["--shard", "3"], True, True, 1, True),
    "stage 3, per-bucket, contiguous, blocking": (["--shard", "3"], False, False, 1, True),
    "stage 2, per-bucket, contiguous, pipelined": (["--shard", "2"], False, True, 1, True),
    "stage 3, per-bucket, contiguous, pipelined": (["--shard", "3"], False, True, 1, True),
    # the compressed runs with the per-bucket update (each stage's defaults: stage 2 blocking,
    # stage 3 pipelined): top-k 1 % + error feedback in the reduce-scatter, bf16 parameters
    # in the allgather
    "stage 2, per-bucket, top-k 1 % + EF": (["--shard", "2", *_TOPK], True, False, 1, True),
    "stage 2, per-bucket, top-k 1 % + EF, bf16 parameters": (
        ["--shard", "2", *_TOPK, *_BF16], True, False, 1, True),
    "stage 3, per-bucket, pipelined, top-k 1 % + EF, bf16 parameters": (
        ["--shard", "3", *_TOPK, *_BF16], True, True, 1, True),
    "stage 2, per-bucket, bf16 parameters": (["--shard", "2", *_BF16], True, False, 1, True),
}


def _run(argv: list[str], comm: MPI.Comm, balanced: bool, pipelined: bool,
         share: int = 16, per_bucket: bool = False) -> tuple[float, bytes, dict]:
    """The slowest rank's median step of one run, the final parameters' bytes, and the peak
    memory per category (the largest over the ranks; ``rss`` is the process's, over every run
    so far) with the mean bytes sent per rank and step."""
    sharded.BALANCED, sharded.BUCKET_SHARE = balanced, share
    sharded.PIPELINED = frozenset({2, 3} if pipelined else ())
    sharded.PER_BUCKET = per_bucket
    pre = parse(argv, comm.size, 10**12)
    ds = datasets.load(pre.args.dataset, pre.args.subset)
    t = Trainer(parse(argv, comm.size, len(ds.y_train)), ds, comm)
    t.t_start = 0.0
    codec = dict.fromkeys(("encode", "decode", "aggregate"), 0.0)

    def observe(phase: str, t0: float, t1: float) -> None:
        codec[phase] += t1 - t0

    OBSERVERS.register("codec", observe)
    try:
        t.train()
    finally:
        OBSERVERS.unregister("codec", observe)
    t.exchange.close()
    full = t.exchange.full_params()
    median = comm.allreduce(float(np.median(t.step_seconds)), op=MPI.MAX)
    ranks = comm.allgather(t.ledger.report())
    extra = {"memory": {k: max(m[k] for m in ranks) for k in ranks[0]},
             "sent_per_step": comm.allreduce(t.exchange.stats.bytes_sent) / comm.size / t.step,
             "test_acc": t.history[-1].get("test_acc") if t.history else None,
             "split_ms": _split(t, codec, comm),
             "reduce_scatters_per_step": sum(len(g[0]) for g in t.exchange.row_groups.values())
             if hasattr(t.exchange, "row_groups") else None}
    return median, comm.bcast(None if full is None else full.tobytes(), root=0), extra


def _split(t: Trainer, codec: dict, comm: MPI.Comm) -> dict:
    """Where a step's time went, in ms per step, the mean over the ranks: the driver's compute
    (forward, backward, the update; the collectives' time inside backward moved out of it), its
    exchange (every collective's blocking call and wait, the codec's work inside them
    included) and the codec's work alone (the observation point ``codec``: encode with error
    feedback, decode, the sparse sum; on the progress engine's thread too, where it may
    overlap compute)."""
    mine = {"compute": t.clock.seconds["compute"], "exchange": t.exchange.stats.seconds,
            **{f"codec_{k}": v for k, v in codec.items()}}
    mine["codec"] = sum(codec.values())
    return {k: comm.allreduce(v) / comm.size / max(1, t.step) * 1e3 for k, v in mine.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", help="comma-separated configuration numbers (0-based) to run")
    ap.add_argument("--json")
    ap.add_argument("driver", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    base = [x for x in a.driver if x != "--"] or ["--model", "wide", "--epochs", "1", "--quiet"]
    comm = MPI.COMM_WORLD
    # each rank's BLAS its share of the cores, as the driver's train() gives it (before
    # 2026-12-07's third pass this script left OpenBLAS at one thread per core in every rank)
    limit_threads(comm.size)
    if comm.rank == 0:  # which tree the ranks run (a launch may compare two, by PYTHONPATH)
        import collectives
        print(f"collectives from {collectives.__file__}", file=sys.stderr, flush=True)
    names = list(CONFIGS) if not a.only else [list(CONFIGS)[int(i)] for i in a.only.split(",")]
    times: dict[str, list[float]] = {k: [] for k in names}
    splits: dict[str, list[dict]] = {k: [] for k in names}
    extras: dict[str, dict] = {}
    bits = set()
    for k in names:  # compile the kernels every configuration calls, on a small model
        _run(["--hidden", "16", "--subset", "128", "--epochs", "1", "--quiet", *CONFIGS[k][0]],
             comm, *CONFIGS[k][1:])
    for r in range(a.rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            extra, *layout = CONFIGS[k]
            comm.Barrier()
            median, params, extras[k] = _run([*base, *extra], comm, *layout)
            times[k].append(median)
            splits[k].append(extras[k]["split_ms"])  # the medians over the rounds so far
            extras[k]["split_ms"] = {part: statistics.median(s[part] for s in splits[k])
                                     for part in splits[k][0]}
            extras[k]["params_sha1"] = hashlib.sha1(params).hexdigest()[:12]
            if "--codec" not in extra and "--param-codec" not in extra:
                bits.add(params)
            if comm.rank == 0:
                print(f"round {r}: {k}: {median * 1e3:.1f} ms", file=sys.stderr, flush=True)
        if comm.rank == 0:  # after every round, so that a run cut short leaves its rounds
            _report(times, extras, bits, comm.size, base, a.json, final=r == a.rounds - 1)


def _report(times: dict, extras: dict, bits: set, world: int, base: list, path: str | None,
            final: bool) -> None:
    """Print (at the end) and write (every round) each configuration's medians."""
    times = {k: v for k, v in times.items() if v}
    dp = statistics.median(times.get("data parallelism", [float("nan")]))
    rows = {k: {"median_ms": statistics.median(v) * 1e3,
                "ratio": statistics.median(v) / dp, "runs_ms": [x * 1e3 for x in v],
                **extras[k]}
            for k, v in times.items()}
    mb = 1e-6
    for k, row in rows.items() if final else ():
        m = row["memory"]
        print(f"{k:50s} {row['median_ms']:8.1f} ms  {row['ratio']:.2f}x  "
              f"runs {[round(x) for x in row['runs_ms']]}  "
              f"sent {row['sent_per_step'] * mb:.1f} MB/step  memory MB: "
              f"params {m['parameters'] * mb:.1f} master {m.get('master', 0) * mb:.1f} "
              f"grads {m['gradients'] * mb:.1f} "
              f"optim {m['optimizer'] * mb:.1f} codec {m['codec'] * mb:.1f} "
              f"buffers {m['buffers'] * mb:.1f} "
              f"total {m['total'] * mb:.1f}  grads+optim {_share(m, rows):.2f} % of data "
              f"parallelism's  reduce-scatters/step {row.get('reduce_scatters_per_step')}  "
              f"params {row['params_sha1']}  ms/step: " + "  ".join(
                  f"{k} {v:.0f}" for k, v in row.get("split_ms", {}).items()))
    if final:
        print(f"same parameters in every run without a codec: {len(bits) == 1}")
    if path:
        with open(path, "w") as f:
            json.dump({"world": world, "driver": base, "configs": rows,
                       "same_bits": len(bits) == 1}, f, indent=1)


def _share(m: dict, rows: dict) -> float:
    """Gradient + optimizer state of a run as a percentage of data parallelism's (nan where
    data parallelism was not run)."""
    dp = rows.get("data parallelism", {}).get("memory")
    if not dp:
        return float("nan")
    return 100 * (m["gradients"] + m["optimizer"]) / (dp["gradients"] + dp["optimizer"])


if __name__ == "__main__":
    main()
