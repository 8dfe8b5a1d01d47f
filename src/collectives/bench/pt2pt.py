"""The loop the point-to-point benchmarks share (``osu_latency``, ``osu_bw``).

Ranks 0 and 1 exchange messages through mpi4py (buffer interface, no pickling: the path our
algorithms' messages take); any other ranks wait at the final barrier. As in OSU, the whole
timed loop is measured at once (after the warm-up iterations) and divided by the iterations.
With ``-c`` rank 1 checks that the last message arrived intact.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence, TextIO

import numpy as np
from mpi4py import MPI

from . import report
from .options import DATATYPES, Iterations, device_error, iterations_for, make_parser, \
    message_sizes
from .results import Record, write_csv, write_json

__all__ = ["Measure", "run_pt2pt"]

#: ``measure(comm, send, recv, iterations, warmup)`` -> the value printed for one size.
Measure = Callable[[MPI.Comm, np.ndarray, np.ndarray, int, int], float]


def run_pt2pt(prog: str, title: str, column: str, measure: Measure, defaults: Iterations,
              argv: Sequence[str] | None, comm: MPI.Comm | None, out: TextIO | None,
              *, latency: bool) -> list[Record]:
    """Parse OSU options, run ``measure`` for every size on ranks 0 and 1, print, write files.

    ``latency`` says whether ``measure`` returns microseconds (else MB/s); records carry both.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    out = sys.stdout if out is None else out
    args = make_parser(prog, f"{title} (OSU-compatible output).", default_min=0,
                       default_max=1 << 22, collective=False).parse_args(argv)
    problem = device_error(args.accelerator) or (
        "-d cuda: the point-to-point benchmarks use host buffers only (OSU's own osu_latency "
        "-d cuda measures device-to-device MPI)" if args.accelerator != "cpu" else None)
    if problem:
        raise SystemExit(f"{prog}: {problem}")
    if comm.size < 2:
        raise SystemExit(f"{prog}: needs at least two ranks (run it under mpiexec -n 2)")
    if comm.rank == 0:
        for line in report.preamble(title, DATATYPES[args.datatype].mpi_name):
            print(line, file=out)
        print(report.column_header([column], validation=args.validation), file=out, flush=True)
    dtype = DATATYPES[args.datatype].dtype
    records = []
    for size in message_sizes(args):
        count = size // dtype.itemsize
        if size and not count:
            continue
        iters, warmup = iterations_for(size, args, defaults)
        send = np.full(count, 1, dtype)
        recv = np.zeros(count, dtype)
        value = measure(comm, send, recv, iters, warmup) if comm.rank < 2 else 0.0
        value = comm.bcast(value, root=0)
        ok = bool(np.array_equal(send, recv)) if comm.rank == 1 else True
        ok = bool(comm.allreduce(int(ok), op=MPI.MIN))
        nbytes = count * dtype.itemsize
        us = value if latency else (nbytes / value if value > 0 else float("nan"))
        if comm.rank == 0:
            print(report.row(nbytes, [value], valid=ok if args.validation else None),
                  file=out, flush=True)
        records.append(Record(prog, "mpi4py", nbytes, comm.size, args.datatype, us, us, us, us,
                              iters, report.algbw_gbs(nbytes, us * 1e-6), float("nan"),
                              ok if args.validation else None))
    comm.Barrier()
    if comm.rank == 0:
        if args.json:
            write_json(args.json, records, benchmark=prog, ranks=comm.size,
                       datatype=args.datatype, argv=list(sys.argv if argv is None else argv))
        if args.csv:
            write_csv(args.csv, records)
    return records
