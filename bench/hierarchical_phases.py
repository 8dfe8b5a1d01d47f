"""Where hierarchical allreduce spends its time: its three phases, timed one by one.

Run across nodes, e.g. ``python bench/cluster.py run --hosts 2 --ranks-per-host 2 --rate 1gbit --
python bench/hierarchical_phases.py --sizes 1M,16M --json phases.json``. For each size (float32,
sum) every rank times, over ``--iterations`` calls after one warm-up: the ring reduce-scatter inside
its node, the flat allreduce of its block across nodes (``--inter``, ring by default), and the ring
allgather inside its node, exactly as ``collectives.algorithms.hierarchical`` runs them (nodes from
``Split_type(COMM_TYPE_SHARED)``, or emulated ones with ``--node-size`` /
``COLLECTIVES_NODE_SIZE``; equal nodes only: no extras to fold). Every call's result is checked
(a vector of ones sums to the number of ranks). Rank 0 prints each rank's median milliseconds per
phase and, with ``--json``, writes them with each rank's host and the machine's load average
(1 minute, before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives.algorithms.flat import FLAT
from collectives.algorithms.hierarchical import layout
from collectives.tools.osu.options import parse_sizes
from collectives.blocks import ring
from collectives.ops import get_op

PHASES = ("intra reduce-scatter", "across nodes", "intra allgather")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=[1 << 20, 16 << 20])
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--inter", default="ring", choices=[n for n in FLAT if n != "native"])
    ap.add_argument("--node-size", type=int, default=None,
                    help="cut each host into emulated nodes of this many ranks")
    ap.add_argument("--json", metavar="PATH", help="write the medians here (rank 0)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    opts = collectives.Options.from_env()
    node_size = args.node_size if args.node_size is not None else opts.node_size
    lay = layout(comm, node_size)
    # every node's size, nodes in the order of their first rank (node rank 0 is its lowest)
    sizes = [size for first, size in comm.allgather((lay.node.rank == 0, lay.node.size)) if first]
    if min(sizes) != max(sizes):
        raise SystemExit(f"hierarchical_phases.py: nodes of unequal size {sizes} (extras) "
                         "are not timed")
    opts = collectives.Options(inter_algorithm=args.inter, segment_bytes=opts.segment_bytes)
    records = []
    load = os.getloadavg()[0]
    for nbytes in args.sizes:
        buf = np.ones(max(nbytes // 4, 1), np.float32)
        nbytes = buf.nbytes
        op = get_op("sum", buf.dtype)
        # the algorithm's blocks: near-equal, the first size % m one element longer
        off = np.cumsum([0] + [b.size for b in np.array_split(buf, lay.m)]).tolist()
        block = buf[off[lay.node.rank]:off[lay.node.rank + 1]]
        phases: dict[str, list[float]] = {name: [] for name in PHASES}
        wrong = 0
        for it in range(args.iterations + 1):
            buf.fill(1)
            comm.Barrier()
            t0 = time.perf_counter()
            ring.reduce_scatter(buf, off, op, lay.holders, opts.segment_bytes, None)  # unguarded
            t1 = time.perf_counter()
            FLAT[args.inter](block, block, op, lay.cross, opts)
            t2 = time.perf_counter()
            ring.allgather(buf, off, lay.holders, None)
            t3 = time.perf_counter()
            wrong += int(np.count_nonzero(buf != comm.size))
            if it:
                for name, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2)):
                    phases[name].append(dt)
        if comm.allreduce(wrong):
            raise SystemExit(f"hierarchical_phases.py: wrong sums at {nbytes} bytes")
        medians = comm.gather({k: float(np.median(v)) * 1e3 for k, v in phases.items()})
        if comm.rank == 0:
            print(f"# {nbytes} bytes, {comm.size} ranks, nodes {sizes}, median ms per phase")
            for rank, m in enumerate(medians):
                print(f"rank {rank}: " + ", ".join(f"{k} {v:.1f}" for k, v in m.items()))
                records.append({"bytes": nbytes, "rank": rank, **{k: m[k] for k in PHASES}})
    hosts = comm.gather(MPI.Get_processor_name())
    lay.free()
    if comm.rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "hierarchical_phases", "ranks": comm.size, "nodes": sizes,
                       "hosts": hosts, "inter": args.inter, "iterations": args.iterations,
                       "unit": "median ms per call",
                       "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
                       "records": records}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
