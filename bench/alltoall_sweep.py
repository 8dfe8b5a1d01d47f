"""``collectives.alltoall`` (the default and each algorithm) against a bare mpi4py
``comm.Alltoall``, and ``collectives.barrier`` against ``comm.Barrier``, in one loop.

Run ``mpiexec -n P python bench/alltoall_sweep.py [--sizes 8,64,512,4K,64K,256K,1M]
[--rounds 7] [--target-ms 20] [--algorithms shm,pairwise,...] [--stat median|min] [--barrier]
[--v] [--json FILE]``. ``--sizes`` are bytes per block
(float32): each rank sends ``P`` blocks, so ``x`` and ``y`` hold ``P`` times that. For each
size every variant is called a few times to warm it, then the number of calls per batch is
chosen so that one batch of the bare call lasts about ``--target-ms`` (the slowest rank's
estimate, so every rank agrees); each round times one batch of every variant, in an order
drawn anew each round (the same on every rank), each batch after a barrier, and a batch's time
per call is the slowest rank's. Rank 0 prints the median over rounds (``--stat min``: the fastest) and its
ratio to the bare call. The bare call runs on a duplicate of ``COMM_WORLD``; the results are
checked after the rounds.

``--v`` times the v form instead: ``collectives.alltoall(x, out=y, counts=...)`` (which learns
its receive counts at every call, Horovod's splits) against ``comm.Alltoallv`` given both
sides' counts, with unequal blocks: rank i sends rank j the size's bytes where i + j is even,
half of them where it is odd (the algorithms without a v form are left out).

``--barrier`` times ``comm.Barrier()`` against ``collectives.barrier()`` (auto: shm on one node,
dissemination across nodes) and ``algorithm="native"`` the same way instead.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

import collectives
from collectives.tools.osu.options import parse_sizes

SIZES = [8, 64, 512, 4096, 65536, 262144, 1 << 20]
ALGORITHMS = ("shm", "pairwise", "bruck", "hierarchical", "native")


def _timed(fn: Callable[[], object], calls: int, comm: MPI.Comm) -> float:
    """One batch of ``calls`` calls after a barrier; the slowest rank's seconds per call."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return comm.allreduce((time.perf_counter() - t0) / calls, op=MPI.MAX)


def _sweep(variants: dict[str, Callable[[], object]], args, comm: MPI.Comm) -> dict[str, float]:
    """Median seconds per call of every variant, rounds alternating; ``variants`` opens with
    the bare call, which sizes the batches."""
    for fn in variants.values():  # warm: first-call set-up, caches, Numba
        _timed(fn, 3, comm)
    bare = next(iter(variants.values()))
    estimate = _timed(bare, 5, comm)
    calls = int(min(max(args.target_ms * 1e-3 / max(estimate, 1e-7), args.min_calls),
                    args.max_calls))
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(args.rounds):
        # a new order every round, the same on every rank (seeded by the round): a variant that
        # always follows the same neighbour (the bare call) would carry what that one leaves
        for name in np.random.default_rng(r).permutation(names):
            times[name].append(_timed(variants[name], calls, comm))
    stat = np.min if args.stat == "min" else np.median
    med = {k: float(stat(v)) for k, v in times.items()}
    med["calls"] = calls
    return med


def _alltoall_rows(args, comm: MPI.Comm, bare: MPI.Comm) -> list[dict]:
    p, rank = comm.size, comm.rank
    rows = []
    for nbytes in args.sizes:
        n = max(nbytes // 4, 1)  # elements per block
        x = np.repeat(np.arange(p, dtype=np.float32) + 1000 * rank, n)  # block j: 1000 rank + j
        outs = {k: np.empty_like(x) for k in ("comm.Alltoall", "default", *args.algorithms)}
        variants = {"comm.Alltoall": lambda: bare.Alltoall(x, outs["comm.Alltoall"]),
                    "default": lambda: collectives.alltoall(x, out=outs["default"])}
        for a in args.algorithms:
            variants[a] = (lambda a=a: collectives.alltoall(x, out=outs[a], algorithm=a))
        med = _sweep(variants, args, comm)
        want = np.repeat(1000 * np.arange(p, dtype=np.float32) + rank, n)  # block i from rank i
        for name, y in outs.items():
            assert np.array_equal(y, want), f"{name} at {nbytes} B per block"
        rows.append({"bytes": nbytes, "calls": med.pop("calls"),
                     **{k: v * 1e6 for k, v in med.items()}})
    return rows


def _alltoallv_rows(args, comm: MPI.Comm, bare: MPI.Comm) -> list[dict]:
    p, rank = comm.size, comm.rank
    names = [a for a in args.algorithms if a not in collectives.algorithms.EQUAL_BLOCKS_ONLY]
    rows = []
    for nbytes in args.sizes:
        n = max(nbytes // 4, 1)  # elements of the even blocks; the odd ones have half
        counts = np.array([[n if (i + j) % 2 == 0 else n // 2 for j in range(p)]
                           for i in range(p)])
        sends, recvs = counts[rank], counts[:, rank]
        sdispls = np.concatenate([[0], np.cumsum(sends)[:-1]])
        rdispls = np.concatenate([[0], np.cumsum(recvs)[:-1]])
        x = np.repeat(np.arange(p, dtype=np.float32) + 1000 * rank, sends)
        outs = {k: np.empty(int(recvs.sum()), np.float32)
                for k in ("comm.Alltoallv", "default", *names)}
        send_spec = [x, (sends.tolist(), sdispls.tolist()), MPI.FLOAT]
        recv_spec = [outs["comm.Alltoallv"], (recvs.tolist(), rdispls.tolist()), MPI.FLOAT]
        split = sends.tolist()
        variants = {"comm.Alltoallv": lambda: bare.Alltoallv(send_spec, recv_spec),
                    "default": lambda: collectives.alltoall(x, out=outs["default"], counts=split)}
        for a in names:
            variants[a] = (lambda a=a: collectives.alltoall(x, out=outs[a], counts=split,
                                                            algorithm=a))
        med = _sweep(variants, args, comm)
        want = np.repeat(1000 * np.arange(p, dtype=np.float32) + rank, recvs)
        for name, y in outs.items():
            assert np.array_equal(y, want), f"{name} at {nbytes} B per even block"
        rows.append({"bytes": nbytes, "calls": med.pop("calls"),
                     **{k: v * 1e6 for k, v in med.items()}})
    return rows


def _barrier_row(args, comm: MPI.Comm, bare: MPI.Comm) -> dict:
    variants = {"comm.Barrier": lambda: bare.Barrier(), "auto": lambda: collectives.barrier(),
                "native": lambda: collectives.barrier(algorithm="native")}
    med = _sweep(variants, args, comm)
    return {"calls": med.pop("calls"), **{k: v * 1e6 for k, v in med.items()}}


def _print(title: str, rows: list[dict], first: str, label: str) -> None:
    names = [k for k in rows[0] if k not in ("bytes", "calls")]
    print(title)
    print(f"{label:>9} {'calls':>6} " + " ".join(f"{k:>20}" for k in names))
    for row in rows:
        cells = [f"{row[k]:>10.2f} ({row[k] / row[first]:>5.2f}x)" for k in names]
        cols = " ".join(f"{c:>20}" for c in cells)
        print(f"{row.get('bytes', '-'):>9} {row['calls']:>6} {cols}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=SIZES, help="bytes per block")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--target-ms", type=float, default=20.0,
                    help="about how long one batch of the bare call lasts")
    ap.add_argument("--min-calls", type=int, default=5)
    ap.add_argument("--max-calls", type=int, default=2000)
    ap.add_argument("--barrier", action="store_true",
                    help="time barrier instead of alltoall")
    ap.add_argument("--v", action="store_true",
                    help="time the v form (counts=) against comm.Alltoallv")
    ap.add_argument("--algorithms", type=lambda s: [a for a in s.split(",") if a],
                    default=list(ALGORITHMS), help="the algorithms timed beside the default "
                    f"(comma-separated; default {','.join(ALGORITHMS)})")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="over the rounds: the median, or the fastest round (on a machine shared "
                    "with other jobs, with short batches: the cost without their preemptions)")
    ap.add_argument("--json", help="write the rows here (rank 0)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    bare = comm.Dup()
    try:
        if args.barrier:
            result = {"ranks": comm.size, "barrier": _barrier_row(args, comm, bare)}
        elif args.v:
            result = {"ranks": comm.size, "rows": _alltoallv_rows(args, comm, bare)}
        else:
            result = {"ranks": comm.size, "rows": _alltoall_rows(args, comm, bare)}
    finally:
        bare.Free()
    if comm.rank == 0:
        head = (f"p = {comm.size}, {collectives.mpi_library()}: us per call, {args.stat} of "
                f"{args.rounds} rounds, slowest rank (ratio to the bare call)")
        if args.barrier:
            _print(f"# barrier, {head}", [result["barrier"]], "comm.Barrier", "")
        elif args.v:
            _print(f"# alltoall(x, out=y, counts=...), float32, bytes per even block (odd: "
                   f"half), {head}", result["rows"], "comm.Alltoallv", "bytes")
        else:
            _print(f"# alltoall(x, out=y), float32, bytes per block, {head}", result["rows"],
                   "comm.Alltoall", "bytes")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
