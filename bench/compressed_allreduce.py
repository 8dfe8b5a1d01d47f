"""Dense against compressed allreduce: time and bytes on the wire per rank, side by side.

Run ``mpiexec -n 4 python bench/compressed_allreduce.py --bytes 67108864 --iterations 3`` (or
under ``bench/netem.py`` or ``bench/cluster.py run`` for a slow network). Every configuration runs
interleaved in each iteration (so drift hits all alike): the dense algorithms of ``--dense``
(default ``native,ring``; fp32), then each ``--codec`` spec (``NAME[:k=v,...]``, with error
feedback where the codec needs it; ``auto:NAME[:k=v,...]`` compresses only where the cost model
predicts it pays, and runs ``--algorithm`` where not) with the strategy "auto" picks, or ``--strategy``;
``--strategy all`` runs every strategy that takes the codec (:func:`strategies_for`).
``--shape ROWSxCOLS`` gives the vector a matrix shape (low-rank codecs such as PowerSGD compress
matrices; a flat vector is one column to them). Rank 0 prints the median time (the slowest
rank's), the bytes each rank sent (mean over ranks; from ``collectives.TRAFFIC``, so native MPI is
estimated as the ring's 2 n (p-1)/p), and the ratio to dense native; ``--json FILE`` writes the
numbers.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives.tools.osu.compressed import codec_state
from collectives.compressed.strategies import STRATEGIES, strategy_for
from compress.protocols import SparsePayload

DEFAULT_CODECS = ["topk:ratio=0.01", "efsignsgd", "qsgd:levels=7"]
#: the sparse strategies (SparCML) take codecs with sparse output only
_SPARSE = ("sparse", "sparse_recursive_doubling", "sparse_split")


def strategies_for(state: collectives.CompressionState) -> list[str]:
    """Every strategy that takes the state's codec and memory (each strategy's own rule) and is
    made for it: the sparse ones for sparse codecs, "two_phase" for those that are not summable
    (DeepSpeed's scheme, made for 1-bit and sign codecs)."""
    base, memory, auto = state.codec, state.memory, state.auto is not None
    names = []
    for name, strategy in STRATEGIES.items():
        if name in _SPARSE and not isinstance(base, SparsePayload):
            continue
        if name == "two_phase" and STRATEGIES["summable"].applies(base, memory):
            continue
        if strategy.applies(base, memory, auto=auto):
            names.append(name)
    return names


def _shape(text: str) -> tuple[int, int]:
    rows, _, cols = text.lower().partition("x")
    try:
        return int(rows), int(cols)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape takes ROWSxCOLS, got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=64 << 20, help="fp32 message size per rank")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--algorithm", default="auto",
                    help="dense algorithm of the compressed calls (summable's representation, "
                         "auto:'s dense steps; default auto)")
    ap.add_argument("--codec", action="append", dest="codecs", metavar="NAME[:k=v,...]",
                    help="a codec to compare (repeatable; default: " + ", ".join(DEFAULT_CODECS) + ")")
    ap.add_argument("--strategy", default="auto",
                    choices=["auto", "all", *collectives.STRATEGIES],
                    help="strategy of every codec: auto's choice, all that take it, or one")
    ap.add_argument("--dense", default="native,ring",
                    help="dense algorithms to time, comma-separated (default native,ring)")
    ap.add_argument("--shape", type=_shape, help="ROWSxCOLS: the vector as a matrix (--bytes "
                    "is then ROWS x COLS x 4)")
    ap.add_argument("--json", help="write the results to this file (rank 0)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    shape = args.shape or (max(args.bytes // 4, 1),)
    n = int(np.prod(shape))
    x = np.random.default_rng(rank).standard_normal(n).astype(np.float32).reshape(shape)
    out = np.empty_like(x)
    dense = [name.strip() for name in args.dense.split(",") if name.strip()]
    unknown = [name for name in dense if name not in collectives.ALGORITHMS]
    if unknown or not dense:
        ap.error(f"--dense: unknown algorithm(s) {', '.join(unknown) or '(none given)'}; valid: "
                 + ", ".join(collectives.ALGORITHMS))
    configs: dict[str, object] = {f"dense {name}": None for name in dense}
    codecs = {spec: codec_state(spec, rank) for spec in args.codecs or DEFAULT_CODECS}
    for spec, codec in codecs.items():
        if args.strategy == "all":
            chosen = strategies_for(codec)
        else:
            chosen = [strategy_for(codec.codec, codec.memory, auto=codec.auto is not None)
                      if args.strategy == "auto" else args.strategy]
        for strategy in chosen:
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
                                                 key="bench", step=step,
                                                 algorithm=args.algorithm)
            elapsed = time.perf_counter() - t
            if step:  # the first round warms up (JIT, buffers)
                times[label].append(elapsed)
                sent[label].append(collectives.TRAFFIC.bytes_sent - before)
    dense_bytes = 2 * n * 4 * (p - 1) / p
    hosts = comm.allgather(MPI.Get_processor_name())
    rows = []
    for label in configs:
        t = comm.allreduce(float(np.median(times[label])), op=MPI.MAX)
        b = comm.allreduce(float(np.mean(sent[label])), op=MPI.SUM) / p
        cfg = configs[label]
        estimated = b == 0  # sent through MPI's own allreduce, which TRAFFIC does not count:
        if estimated and cfg is None:  # what a bandwidth-optimal MPI_Allreduce sends
            b = dense_bytes
        elif estimated:  # "summable" over native: the same, on the codec's payload
            b = 2 * cfg[0].codec.payload_nbytes(shape, x.dtype) * (p - 1) / p
        rows.append({"config": label, "time_s": t, "bytes_per_rank": b,
                     "bytes_estimated": estimated})
    if rank == 0:
        base = next((r["time_s"] for r in rows if r["config"] == "dense native"),
                    rows[0]["time_s"])
        print(f"# {p} ranks, {n * 4} bytes fp32, median of {args.iterations}")
        print(f"{'configuration':<44}{'time (ms)':>12}{'x native':>10}{'MB sent/rank':>14}"
              f"{'x dense':>9}")
        for r in rows:
            mark = "*" if r["bytes_estimated"] else " "
            print(f"{r['config']:<44}{r['time_s'] * 1e3:>12.1f}{r['time_s'] / base:>10.2f}"
                  f"{r['bytes_per_rank'] / 1e6:>13.2f}{mark}"
                  f"{r['bytes_per_rank'] / dense_bytes:>9.3f}")
        if any(r["bytes_estimated"] for r in rows):
            print("# *: sent through MPI_Allreduce, not counted; a ring's 2 S (p-1)/p shown")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": p, "bytes": n * 4, "shape": list(shape), "rows": rows,
                           "hosts": hosts}, f, indent=1)


if __name__ == "__main__":
    import sys

    from collectives.tools import program

    sys.exit(program("compressed_allreduce", main)())
