"""A short multi-rank demonstration: every algorithm, checked against MPI_Allreduce and timed.

Run ``mpiexec -n 4 python -m collectives demo [--bytes N] [--iterations K]``. Rank 0 prints, for
each algorithm, whether its result matches the native ``MPI_Allreduce`` bit for bit on integers
and within rounding on floats, and its median time against a bare ``comm.Allreduce`` of mpi4py
timed in the same loop (what a program that calls MPI directly pays; ``native`` is our call of
that same ``MPI_Allreduce``, with the library's checks and guard around it).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..algorithms import ALGORITHMS
from ..api import allreduce
from .._runtime.cli import Parser, program, usage_errors

PROG = "python -m collectives demo"
#: the row of the bare ``comm.Allreduce`` (mpi4py), which every row's ratio divides by
BARE = "bare comm.Allreduce"


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog=PROG, description=__doc__)  # help and errors once, by rank 0
    parser.add_argument("--bytes", type=int, default=1 << 20, help="message size (float32)")
    parser.add_argument("--iterations", type=int, default=20)
    with usage_errors(PROG):
        args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal(max(args.bytes // 4, 1)).astype(np.float32)
    ints = rng.integers(-100, 100, x.size).astype(np.int32)
    ref_f, ref_i = allreduce(x, algorithm="native"), allreduce(ints, algorithm="native")
    out = np.empty_like(x)
    bare = comm.Dup()  # mpi4py's own call, on a communicator of its own
    runs = {BARE: lambda: bare.Allreduce(x, out, op=MPI.SUM)}
    runs.update({name: (lambda name=name: allreduce(x, out=out, algorithm=name))
                 for name in ALGORITHMS})
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.iterations):  # interleaved, so drift hits every algorithm alike
        for name, run in runs.items():
            comm.Barrier()
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    bare.Free()
    ok = {name: bool(np.array_equal(allreduce(ints, algorithm=name), ref_i)
                     and np.allclose(allreduce(x, algorithm=name), ref_f, rtol=1e-5, atol=1e-4))
          for name in ALGORITHMS}
    slowest = {name: comm.allreduce(float(np.median(t)), op=MPI.MAX) for name, t in times.items()}
    if comm.rank == 0:
        print(f"allreduce of {x.nbytes} bytes (float32) on {comm.size} ranks, "
              f"median of {args.iterations}")
        print(f"{'algorithm':<20}{'correct':>8}{'time (us)':>12}{'x bare MPI':>12}")
        for name in runs:
            ratio = slowest[name] / slowest[BARE]
            checked = "-" if name == BARE else "yes" if ok[name] else "NO"
            print(f"{name:<20}{checked:>8}"
                  f"{slowest[name] * 1e6:>12.1f}{ratio:>12.2f}")
    if not all(comm.allgather(all(ok.values()))):
        raise SystemExit("some algorithm gave a wrong result")


if __name__ == "__main__":
    import sys

    sys.exit(program(PROG, main)())
