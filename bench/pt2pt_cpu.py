"""The CPU time of a repeated ``send`` + ``recv``, one process, no waiting (load-proof).

``python bench/pt2pt_cpu.py [SIZE]`` (bytes, default 8; no ``mpiexec``: ``COMM_SELF``)

A ping-pong's wall time on a shared, loaded machine measures the scheduler more than the
library (at a load of 10-15 on 2 cores a bare 8 B message took 80-140 us instead of 1.3 us,
docs/benchmarks/alltoall.md). This measures what the library adds instead: one process sends
``SIZE`` bytes of float32 to itself and receives ``SIZE`` bytes from itself, ``K`` times, each
message met by a request posted beforehand (an ``Irecv`` for each send, an ``Isend`` for each
receive), so that no call waits, and ``time.thread_time_ns`` counts this thread's CPU alone
(time on the CPU, not time preempted). Three variants take turns in a new random order every
round: bare ``comm.Send``/``comm.Recv`` (the library's wire tag, so that both match the same
posted requests), ``collectives.send``/``recv`` (remembered repeats), and the same with the
observers of ``pt2pt`` (the flight recorder) unregistered. Printed: medians over rounds, ns per
send + recv, and what each adds over the bare calls. Run it with ``PYTHONPATH=<tree>/src``
for each tree to compare, alternating.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives import observe

K = 2000
ROUNDS = 15


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    comm = MPI.COMM_SELF
    n = max(size // 4, 1)
    # each variant its own arrays: repeats are remembered by their arrays
    arrays = {k: (np.ones(n, np.float32), np.empty(n, np.float32))
              for k in ("bare", "ours", "no observers")}
    peer_in, peer_out = np.empty(n, np.float32), np.ones(n, np.float32)
    # wire tags: send(tag=1) of float32 goes out with 1 * 16 + 1, recv(tag=0) probes 0 * 16 + 1
    sent, received = 1 * 16 + 1, 0 * 16 + 1

    def post() -> list:
        reqs = []
        for _ in range(K):
            reqs.append(comm.Irecv([peer_in, MPI.BYTE], 0, sent))  # meets one send
            reqs.append(comm.Isend([peer_out, MPI.BYTE], 0, received))  # meets one recv
        return reqs

    def bare(x, y):
        comm.Send([x, MPI.BYTE], 0, sent)
        comm.Recv([y, MPI.BYTE], 0, received)

    def ours(x, y):
        collectives.send(x, 0, tag=1, comm=comm)
        collectives.recv(y, 0, comm=comm)

    fns = {"bare": bare, "ours": ours, "no observers": ours}
    times: dict[str, list[float]] = {k: [] for k in fns}
    observers = observe.OBSERVERS.pt2pt
    for rnd in range(ROUNDS):
        for k in np.random.default_rng(rnd).permutation(list(fns)):
            x, y = arrays[k]
            fn = fns[k]
            if k == "no observers":
                for ob in observers:
                    observe.unregister("pt2pt", ob)
            reqs = post()
            t0 = time.thread_time_ns()
            for _ in range(K):
                fn(x, y)
            times[k].append((time.thread_time_ns() - t0) / K)
            MPI.Request.Waitall(reqs)
            if k == "no observers":
                for ob in observers:
                    observe.register("pt2pt", ob)
    m = {k: statistics.median(v) for k, v in times.items()}
    print(f"{size} B, ns of CPU per send + recv: bare {m['bare']:.0f}, send/recv "
          f"{m['ours']:.0f} (+{m['ours'] - m['bare']:.0f}), no observers "
          f"{m['no observers']:.0f} (+{m['no observers'] - m['bare']:.0f})")


if __name__ == "__main__":
    main()
