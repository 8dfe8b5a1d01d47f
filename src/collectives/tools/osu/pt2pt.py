"""The loop the point-to-point benchmarks share (``osu_latency``, ``osu_bw``).

Ranks 0 and 1 exchange messages; any other ranks wait at the final barrier. As in OSU, the whole
timed loop is measured at once (after the warm-up iterations) and divided by the iterations.
With ``-c`` rank 1 checks that the last message arrived intact.

``--algorithm`` says whose messages (:data:`APIS`): ``mpi`` (the default) sends them through
mpi4py's buffer methods (``comm.Send``/``Recv``/``Isend``/``Irecv``, no pickling: the path our
algorithms' messages take, and the baseline), ``collectives`` through this library's
point-to-point calls (``collectives.send``/``recv``/``isend``/``irecv``: their checks, the
dtype in the tag, ``Options.timeout``); ``all`` measures both, one after the other at each
size, and prints a column each (``mpi(us)``, ``collectives(us)``), as the collective
benchmarks' ``--algorithm all`` does. The benchmark's measure is one body that takes the
:class:`Api` to use.

``--matrix`` runs the measurement between every ordered pair of ranks instead, one size after
another, and prints a matrix per size (:mod:`collectives.tools.osu.pairs`); the JSON/CSV records then
name each pair ``"i->j"`` in their ``algorithm`` field, and the JSON says which host each rank
ran on (``"hosts"``). Without ``-m``/``--sizes`` it measures 1 MiB only.

Header in OSU 7.x's point-to-point order (``osu_latency.c``, ``osu_bw.c``): the title line, the
column header, then ``# Datatype: ...`` (the collectives print the datatype before the column
header, and a blank line first).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TextIO

import numpy as np
from mpi4py import MPI

from ..._runtime.cli import UsageError, usage_errors
from ...pt2pt import messages
from . import pairs, report
from .options import DATATYPES, Iterations, device_error, iterations_for, make_parser, \
    message_sizes
from .results import Record
from .sweep import Sweep

__all__ = ["Api", "APIS", "Measure", "run_pt2pt", "MATRIX_DEFAULT_BYTES"]

#: the one size ``--matrix`` measures when no ``-m``/``--sizes`` is given
MATRIX_DEFAULT_BYTES = 1 << 20


@dataclass(frozen=True)
class Api:
    """Whose messages a benchmark sends: ``send(comm, buf, peer, tag)``,
    ``recv(comm, buf, peer, tag)``, ``isend``/``irecv`` (same arguments, a request back) and
    ``waitall(requests)``."""

    send: Callable[[MPI.Comm, np.ndarray, int, int], None]
    recv: Callable[[MPI.Comm, np.ndarray, int, int], None]
    isend: Callable[[MPI.Comm, np.ndarray, int, int], Any]
    irecv: Callable[[MPI.Comm, np.ndarray, int, int], Any]
    waitall: Callable[[list], None]


def _wait_each(requests: list) -> None:
    for request in requests:
        request.wait()


#: ``--algorithm`` choices: mpi4py's buffer methods (the baseline), and this library's calls.
APIS: dict[str, Api] = {
    "mpi": Api(send=lambda comm, buf, peer, tag: comm.Send([buf, MPI.BYTE], peer, tag),
               recv=lambda comm, buf, peer, tag: comm.Recv([buf, MPI.BYTE], peer, tag),
               isend=lambda comm, buf, peer, tag: comm.Isend([buf, MPI.BYTE], peer, tag),
               irecv=lambda comm, buf, peer, tag: comm.Irecv([buf, MPI.BYTE], peer, tag),
               waitall=MPI.Request.Waitall),
    "collectives": Api(
        send=lambda comm, buf, peer, tag: messages.send(buf, peer, tag=tag, comm=comm),
        recv=lambda comm, buf, peer, tag: messages.recv(buf, peer, tag=tag, comm=comm),
        isend=lambda comm, buf, peer, tag: messages.isend(buf, peer, tag=tag, comm=comm),
        irecv=lambda comm, buf, peer, tag: messages.irecv(buf, peer, tag=tag, comm=comm),
        waitall=_wait_each),
}

#: ``measure(comm, send, recv, iterations, warmup, api)`` -> the value printed for one size.
Measure = Callable[[MPI.Comm, np.ndarray, np.ndarray, int, int, Api], float]


def run_pt2pt(prog: str, title: str, column: str, measure: Measure, defaults: Iterations,
              argv: Sequence[str] | None, comm: MPI.Comm | None, out: TextIO | None,
              *, latency: bool) -> list[Record]:
    """Parse OSU options, run ``measure`` for every size on ranks 0 and 1, print, write files.

    ``latency`` says whether ``measure`` returns microseconds (else MB/s); records carry both.
    A usage error is printed once and ends every rank with ``SystemExit(2)``.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    with usage_errors(prog, comm.rank):
        return _run(prog, title, column, measure, defaults, argv, comm,
                    sys.stdout if out is None else out, latency)


def _run(prog, title, column, measure, defaults, argv, comm, out, latency) -> list[Record]:
    args = make_parser(prog, f"{title} (OSU-compatible output).", default_min=0,
                       default_max=1 << 22, collective=False, pairs=True,
                       apis=list(APIS), rank=comm.rank).parse_args(argv)
    problem = device_error(args.accelerator) or (
        "-d cuda: the point-to-point benchmarks use host buffers only (OSU's own osu_latency "
        "-d cuda measures device-to-device MPI)" if args.accelerator != "cpu" else None)
    if problem:
        raise UsageError(problem)
    if comm.size < 2:
        raise UsageError("needs at least two ranks (run it under mpiexec -n 2)")
    if args.algorithm != "all" and args.algorithm not in APIS:
        raise UsageError(f"unknown algorithm {args.algorithm!r}; valid choices: "
                         f"{', '.join(APIS)}, all")
    names = list(APIS) if args.algorithm == "all" else [args.algorithm]
    if args.matrix and len(names) > 1:
        raise UsageError("--matrix measures one --algorithm at a time (mpi or collectives)")
    if args.matrix and args.message_size is None and args.sizes is None:
        args.sizes = [MATRIX_DEFAULT_BYTES]
    dtype = DATATYPES[args.datatype].dtype
    sizes = [s for s in message_sizes(args) if not s or s // dtype.itemsize]
    meta = {"benchmark": prog, "ranks": comm.size, "datatype": args.datatype,
            "argv": list(sys.argv if argv is None else argv)}
    if args.matrix:
        hosts = comm.allgather(MPI.Get_processor_name())
        with Sweep(prog, args, sizes, comm.rank, out,
                   {**meta, "matrix": True, "hosts": hosts}) as sweep:
            return _matrix(prog, title, column, measure, defaults, args, comm, sweep, sizes,
                           hosts, latency, APIS[names[0]])
    unit = "(us)" if latency else "(MB/s)"
    titles = [column] if len(names) == 1 else [f"{n}{unit}" for n in names]
    if comm.rank == 0:
        print(report.title_line(title), file=out)
        print(report.column_header(titles, validation=args.validation), file=out)
        print(report.datatype_line(DATATYPES[args.datatype].mpi_name), file=out, flush=True)
    with Sweep(prog, args, sizes, comm.rank, out, meta) as sweep:
        records = []
        for size in sizes:
            count = size // dtype.itemsize
            nbytes = count * dtype.itemsize
            iters, warmup = iterations_for(size, args, defaults)
            send = np.full(count, 1, dtype)
            values, valid = [], []
            for name in names:
                recv = np.zeros(count, dtype)
                value = measure(comm, send, recv, iters, warmup, APIS[name]) \
                    if comm.rank < 2 else 0.0
                value = comm.bcast(value, root=0)
                ok = bool(np.array_equal(send, recv)) if comm.rank == 1 else True
                ok = bool(comm.allreduce(int(ok), op=MPI.MIN))
                us = value if latency else (nbytes / value if value > 0 else float("nan"))
                values.append(value)
                valid.append(ok)
                records.append(Record(prog, name, nbytes, comm.size, args.datatype, us, us, us,
                                      us, iters, report.algbw_gbs(nbytes, us * 1e-6),
                                      float("nan"), ok if args.validation else None))
            sweep.print(report.row(nbytes, values, valid=all(valid) if args.validation else None,
                                   titles=titles))
            sweep.size_done(nbytes, records)
        comm.Barrier()
        sweep.finish(records)
    return records


def _matrix(prog, title, column, measure, defaults, args, comm, sweep, sizes, hosts,
            latency, api) -> list[Record]:
    """``--matrix``: every ordered pair of ranks at every size; one matrix printed per size."""
    sweep.print(report.title_line(title))
    sweep.print(f"# Every ordered pair of ranks: row = from (rank@host), column = to; {column}")
    sweep.print(report.datatype_line(DATATYPES[args.datatype].mpi_name))
    dtype = DATATYPES[args.datatype].dtype
    labels = [f"{r}@{h}" for r, h in enumerate(hosts)]
    records: list[Record] = []
    for size in sizes:
        count = size // dtype.itemsize
        nbytes = count * dtype.itemsize
        iters, warmup = iterations_for(size, args, defaults)
        send, recv = np.full(count, 1, dtype), np.zeros(count, dtype)
        matrix = pairs.measure_pairs(comm, lambda *a: measure(*a, api), send, recv, iters,
                                     warmup)
        sweep.print(f"# Size {nbytes}")
        for line in pairs.format_matrix(matrix, labels):
            sweep.print(line)
        for (i, j), value in np.ndenumerate(matrix):
            if i != j:
                us = value if latency else (nbytes / value if value > 0 else float("nan"))
                records.append(Record(prog, f"{i}->{j}", nbytes, comm.size, args.datatype, us, us,
                                      us, us, iters, report.algbw_gbs(nbytes, us * 1e-6),
                                      float("nan")))
        sweep.size_done(nbytes, records)
    comm.Barrier()
    sweep.finish(records)
    return records
