"""Dense against compressed allreduce: time and bytes on the wire per rank, side by side.

Run ``mpiexec -n 4 python bench/compressed_allreduce.py --bytes 67108864 --iterations 3`` (or
under ``bench/netem.py`` for a slow network). Every configuration runs interleaved in each
iteration (so drift hits all alike): dense ``native`` and ``ring`` (fp32), then each ``--codec``
spec (``NAME[:k=v,...]``, with error feedback where the codec needs it) with the strategy "auto"
picks, or ``--strategy``. Rank 0 prints the median time (the slowest rank's), the bytes each
rank sent (mean over ranks; from ``collectives.TRAFFIC``, so native MPI is estimated as the
ring's 2 n (p-1)/p), and the ratio to dense native; ``--json FILE`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives.bench.compressed import make_codec
from collectives.compressed.strategies import choose

DEFAULT_CODECS = ["topk:ratio=0.01", "efsignsgd", "qsgd:levels=7"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=64 << 20, help="fp32 message size per rank")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--codec", action="append", dest="codecs", metavar="NAME[:k=v,...]",
                    help="a codec to compare (repeatable; default: " + ", ".join(DEFAULT_CODECS) + ")")
    ap.add_argument("--strategy", default="auto", choices=["auto", *collectives.STRATEGIES])
    ap.add_argument("--json", help="write the results to this file (rank 0)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    n = max(args.bytes // 4, 1)
    x = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
    out = np.empty_like(x)
    configs: dict[str, object] = {"dense native": None, "dense ring": None}
    codecs = {spec: make_codec(spec, rank) for spec in args.codecs or DEFAULT_CODECS}
    for spec, codec in codecs.items():
        strategy = choose(getattr(codec, "codec", codec)) if args.strategy == "auto" \
            else args.strategy
        configs[f"{spec} [{strategy}]"] = (codec, strategy)
    times: dict[str, list[float]] = {k: [] for k in configs}
    sent: dict[str, list[int]] = {k: [] for k in configs}
    for step in range(args.iterations + 1):
        for label, cfg in configs.items():
            comm.Barrier()
            before = collectives.TRAFFIC.bytes_sent
            t = time.perf_counter()
            if cfg is None:
                collectives.allreduce(x, out=out, op="avg", algorithm=label.split()[1])
            else:
                codec, strategy = cfg
                collectives.compressed_allreduce(x, codec, out=out, strategy=strategy,
                                                 key="bench", step=step)
            elapsed = time.perf_counter() - t
            if step:  # the first round warms up (JIT, buffers)
                times[label].append(elapsed)
                sent[label].append(collectives.TRAFFIC.bytes_sent - before)
    dense_bytes = 2 * n * 4 * (p - 1) / p
    rows = []
    for label in configs:
        t = comm.allreduce(float(np.median(times[label])), op=MPI.MAX)
        b = comm.allreduce(float(np.mean(sent[label])), op=MPI.SUM) / p
        if label == "dense native":
            b = dense_bytes
        rows.append({"config": label, "time_s": t, "bytes_per_rank": b})
    if rank == 0:
        base = rows[0]["time_s"]
        print(f"# {p} ranks, {n * 4} bytes fp32, median of {args.iterations}")
        print(f"{'configuration':<34}{'time (ms)':>12}{'x native':>10}{'MB sent/rank':>14}"
              f"{'x dense':>9}")
        for r in rows:
            print(f"{r['config']:<34}{r['time_s'] * 1e3:>12.1f}{r['time_s'] / base:>10.2f}"
                  f"{r['bytes_per_rank'] / 1e6:>14.2f}{r['bytes_per_rank'] / dense_bytes:>9.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": p, "bytes": n * 4, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    import sys

    from collectives._cli import program

    sys.exit(program("compressed_allreduce", main)())
