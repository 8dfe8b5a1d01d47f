"""The remembered allreduce's own work per repeat: finding the entry and re-checking the arrays.

``mpiexec -n 2 python bench/repeat_lookup.py --calls N [--in-place] [--torch]``

Both ranks call ``collectives.allreduce(x, out=...)`` on 8 B of float32 until the call is
remembered (the library's cache of remembered calls), then rank 0 takes the entry
(:func:`collectives.diagnostics.probe.remembered`), makes its run a function that does nothing,
and calls ``collectives.allreduce(x, out=...)`` ``N`` times: what is left is the public call's
repeat path (the lookup: weak references and names; the options argument; the re-checks of what
can change in place) and the failure guard is not entered. No MPI call is made in that loop;
rank 1 waits at a barrier. ``--torch``: the arrays are PyTorch CPU tensors (the entry keeps
views of their memory). Meant for counting instructions, which no other job on the machine
moves, as the difference of two runs, rank 0 under callgrind (MPICH's ``mpiexec`` starts the
two ranks with different commands, separated by ``:``)::

    export OPENBLAS_NUM_THREADS=1   # OpenBLAS's idle threads spin inside the count otherwise
    for n in 0 20000; do
      mpiexec -n 1 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
          python bench/repeat_lookup.py --calls $n [--in-place] [--torch] : \\
          -n 1 python bench/repeat_lookup.py --calls $n [--in-place] [--torch] 2>&1 |
        grep Collected
    done   # (second - first) / 20000: instructions per repeat

Without valgrind it prints the mean time per repeat (a noisy machine moves it). (Until this
version it made the entry by hand in one process, with private names of the library; the
counts are of the same path.)
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import collectives
from collectives.diagnostics import probe


def _nothing(*args: Any, **kwargs: Any) -> None:
    """The entry's run in the timed calls."""


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--in-place", action="store_true", help="allreduce(x, out=x)")
    ap.add_argument("--torch", action="store_true", help="PyTorch CPU tensors")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        raise SystemExit("run it with mpiexec -n 2: with one rank no call is remembered")
    if args.torch:
        import torch

        x = torch.ones(2, dtype=torch.float32)
        out = x if args.in_place else torch.ones(2, dtype=torch.float32)
    else:
        x = np.ones(2, np.float32)
        out = x if args.in_place else np.ones(2, np.float32)
    for _ in range(3):  # the first call checks and remembers, the others repeat
        collectives.allreduce(x, out=out)
    comm.Barrier()
    per_call = 0.0
    if comm.rank == 0:
        entry = probe.remembered(x, out)
        if entry is None:
            raise SystemExit("not remembered: the bench no longer matches the cache")
        ran = []
        entry.run = lambda *a, **k: ran.append(1)  # one call: is it a repeat?
        collectives.allreduce(x, out=out)
        if not ran:
            raise SystemExit("not a repeat: the bench no longer matches collectives.allreduce")
        entry.run = _nothing
        allreduce = collectives.allreduce
        t0 = time.perf_counter()
        for _ in range(args.calls):
            allreduce(x, out=out)
        per_call = (time.perf_counter() - t0) / max(args.calls, 1)
        how = "in place" if args.in_place else "out of place"
        print(f"{per_call * 1e9:.0f} ns per repeat ({how}{', torch' if args.torch else ''})")
    comm.Barrier()
    return per_call


if __name__ == "__main__":
    main()
