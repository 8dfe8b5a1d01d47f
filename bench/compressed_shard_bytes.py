"""Bytes on the wire of the compressed reduce-scatter and allgather against the dense ones.

Run ``mpiexec -n 4 python bench/compressed_shard_bytes.py`` (``--elements N``, default 2**22
float32). Each rank's ``x`` is the whole vector for the reduce-scatters and a ``1/p`` shard of it
for the allgathers. Rank 0 prints a Markdown table: the bytes each rank sent (mean over ranks,
from ``collectives.TRAFFIC``: the library's own messages, exact) and the ratio to the dense ring
call of the same kind. Bytes only: they follow from the schedule and the payload sizes, not from
the machine, so one run on any machine gives them.
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import collectives

SCATTER = [("topk:ratio=0.01", "auto"), ("efsignsgd", "auto"), ("qsgd:levels=127", "auto"),
           ("fp16", "alltoall"), ("fp16", "summable"), ("bf16", "auto")]
GATHER = ["fp16", "bf16", "eightbit:bucket=256"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 22)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    x = np.random.default_rng(r).standard_normal(args.elements).astype(np.float32)
    shard = x[:args.elements // p]

    def sent(run) -> float:
        before = collectives.TRAFFIC.bytes_sent
        run()
        return comm.allreduce(collectives.TRAFFIC.bytes_sent - before) / p

    rows = []
    dense = sent(lambda: collectives.reduce_scatter(x, op="avg", algorithm="ring"))
    rows.append(("reduce_scatter (ring, float32)", dense, dense))
    for spec, strategy in SCATTER:
        b = sent(lambda: collectives.compressed_reduce_scatter(x, spec, strategy=strategy,
                                                               key="g"))
        rows.append((f"compressed_reduce_scatter {spec} ({strategy})", b, dense))
    dense = sent(lambda: collectives.allgather(shard, algorithm="ring"))
    rows.append(("allgather (ring, float32)", dense, dense))
    for spec in GATHER:
        b = sent(lambda: collectives.compressed_allgather(shard, spec, key="w"))
        rows.append((f"compressed_allgather {spec}", b, dense))
    if r == 0:
        print(f"p = {p}, {args.elements} float32 elements\n")
        print("| call | MiB sent per rank | / dense |\n|---|---:|---:|")
        for name, b, base in rows:
            print(f"| {name} | {b / 2**20:.3f} | {b / base:.3f} |")


if __name__ == "__main__":
    main()
