"""Point-to-point cost against mpi4py's buffer methods, side by side (p = 2).

``mpiexec -n 2 python bench/pt2pt.py [--sizes 8,64K,1M] [--rounds 7] [--timeout]``

A ping-pong between ranks 0 and 1: rank 0 sends ``size`` bytes (float32) and receives them back,
rank 1 the reverse; the time of one message is half a round trip. In every round each variant
makes its ping-pongs back to back, timed as a whole, and the variants take turns within the
round, so that load on a shared machine hits them alike. Reported: rank 0's median over rounds
(microseconds per message) and its ratio to the bare pair's median.

- ``comm.Send/Recv``: mpi4py's ``comm.Send(x, peer)`` / ``comm.Recv(y, peer)``;
- ``send/recv``: ``collectives.send(x, peer)`` / ``collectives.recv(y, peer)`` (the dtype in the
  tag, the count checked: src/collectives/pt2pt/messages.py);
- ``send/recv(timeout)`` (``--timeout``): the same with ``Options(timeout=60)``, whose sends
  wait under the deadline too (``Isend`` and tests instead of ``MPI_Send``);
- ``sendrecv``, ``comm.Sendrecv``: both directions at once, one call per rank.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import collectives


def _sizes(text: str) -> list[int]:
    units = {"K": 1 << 10, "M": 1 << 20}
    return [int(t[:-1]) * units[t[-1]] if t[-1] in units else int(t) for t in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_sizes, default=_sizes("8,64K,1M"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--timeout", action="store_true")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise SystemExit("run with mpiexec -n 2")
    r = comm.rank
    peer = 1 - r
    timed = collectives.Options(timeout=60.0)

    def bare(x, y):
        if r == 0:
            comm.Send(x, peer)
            comm.Recv(y, peer)
        else:
            comm.Recv(y, peer)
            comm.Send(x, peer)

    def ours(x, y, options=None):
        if r == 0:
            collectives.send(x, peer, options=options)
            collectives.recv(y, peer, options=options)
        else:
            collectives.recv(y, peer, options=options)
            collectives.send(x, peer, options=options)

    variants = {"comm.Send/Recv": bare, "send/recv": ours}
    if args.timeout:
        variants["send/recv(timeout)"] = lambda x, y: ours(x, y, timed)
    variants["comm.Sendrecv"] = lambda x, y: comm.Sendrecv(x, peer, recvbuf=y, source=peer)
    variants["sendrecv"] = lambda x, y: collectives.sendrecv(x, peer, y, peer)
    if r == 0:
        print("| bytes | " + " | ".join(variants) + " |")
        print("|---" * (len(variants) + 1) + "|")
    for size in args.sizes:
        x = np.ones(max(size // 4, 1), np.float32)
        y = np.empty_like(x)
        reps = 2000 if size <= 4096 else 500 if size <= 1 << 17 else 100
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                for _ in range(10):
                    fn(x, y)
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn(x, y)
                times[name].append((time.perf_counter() - t0) / reps / 2 * 1e6)
        if r == 0:
            med = {name: statistics.median(v) for name, v in times.items()}
            base = med["comm.Send/Recv"]
            cells = [f"{med[n]:.2f} ({med[n] / base:.2f})" if not n.endswith("Sendrecv") else
                     f"{med[n]:.2f}" for n in variants]
            print(f"| {x.nbytes} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
