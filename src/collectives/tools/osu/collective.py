"""The loop every collective benchmark shares: sizes, buffers, interleaved timing, rows, files.

A benchmark is a :class:`Spec`: its OSU name and title, its algorithm table, how to allocate its
buffers, how to call it, what the correct result is (for ``-c``) and its nccl-tests bus-bandwidth
name. :func:`run` parses the OSU-style options, then for every message size (``S`` bytes, the
OSU meaning of each collective's size) times the chosen algorithm, or with ``--algorithm all``
every algorithm of the table, interleaved in one loop, after ``mpi``: the MPI library's own
collective as a user calls it from mpi4py (``comm.Allreduce(x, out, op=MPI.SUM)``, outside this
library: the baseline every ratio is taken against), then ``native`` (``algorithm="native"``:
the same MPI call through this library's checks and failure guard); prints OSU rows on rank 0;
validates once per size and algorithm after timing; and writes ``--json``/``--csv``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Sequence, TextIO

import numpy as np
from mpi4py import MPI

from ... import api
from ..._runtime.arrays import xp
from ..._runtime.cli import UsageError, program, usage_errors
from ...options import Options
from . import compressed, report
from .options import (DATATYPES, device_error, iterations_for, make_parser, message_sizes,
                      to_accelerator, to_host)
from .results import Record
from .sweep import Sweep
from .timing import Stat, time_interleaved

__all__ = ["Spec", "Buffers", "run", "entry_point", "rooted", "pattern", "column_label"]

#: Column titles that would not fit in the 20-character OSU field.


@dataclass
class Buffers:
    """Input and output of one call."""

    x: np.ndarray
    out: np.ndarray


@dataclass(frozen=True)
class Spec:
    """One collective benchmark.

    Attributes
    ----------
    prog, title
        OSU program name (``osu_allreduce``) and title (``Allreduce Latency Test``).
    collective
        Key of :data:`report.BUSBW_FACTOR`.
    algorithms
        The algorithm table (name -> function); ``--algorithm all`` times every entry.
    buffers
        ``buffers(count, dtype, comm)`` -> :class:`Buffers` for ``count`` elements (the OSU size).
    expected
        ``expected(count, dtype, comm)`` -> this rank's correct output (for ``-c``).
    call
        ``call(algorithm, buffers, comm, options)`` runs the collective once into ``buffers.out``.
    bus_bytes
        ``bus_bytes(size, p)``: the S of nccl-tests' ``algbw = S / t`` for a size of ``size``.
    default_max
        OSU's default largest message (1 MiB for collectives).
    """

    prog: str
    title: str
    collective: str
    algorithms: Sequence[str]
    buffers: Callable[[int, np.dtype, MPI.Comm], Buffers]
    expected: Callable[[int, np.dtype, MPI.Comm], np.ndarray]
    call: Callable[[str, Buffers, MPI.Comm, Options], object]
    bus_bytes: Callable[[int, int], int] = lambda size, p: size
    default_max: int = 1 << 20
    default_algorithm: str = "auto"
    compressed: bool = False  # offers --codec / --strategy (allreduce only)
    #: ``available(name, comm, options)``: whether ``--algorithm all`` can run ``name`` here
    available: Callable[[str, MPI.Comm, Options], bool] = lambda name, comm, options: True
    #: ``mpi(buffers, comm)``: the bare mpi4py call (the ``mpi`` column of ``--algorithm all``)
    mpi: Callable[[Buffers, MPI.Comm], object] | None = None
    #: False for a call that moves no data (barrier): one row, no size column, as OSU prints it
    sized: bool = True


#: The column of the bare mpi4py call: the MPI library as a user calls it, outside this library.
MPI_COLUMN = "mpi"
#: dtypes mpi4py's buffers map to a predefined MPI type (not float16, which MPI lacks)
_MPI_KINDS = frozenset({np.dtype(t) for t in (np.int8, np.int32, np.float32, np.float64)})


def _invoke(spec: Spec, name: str, buf: Buffers, comm: MPI.Comm, options: Options) -> object:
    """One call of column ``name``: the bare MPI call or one of the library's algorithms."""
    if name == MPI_COLUMN:
        return spec.mpi(buf, comm)
    return spec.call(name, buf, comm, options)


def rooted(name: str, mpi_call: Callable) -> dict:
    """``call`` and ``mpi`` of a :class:`Spec` for a collective rooted at rank 0 that writes
    ``Buffers.x``'s result into ``Buffers.out``: ``api.<name>(x, root=0, out=out, algorithm=...,
    comm=..., options=...)``, the call of this library (looked up at each call, as a call
    written out would be), and ``mpi_call(comm, x, out, root=0)``, the ``MPI.Comm`` method a
    user of mpi4py calls (``MPI.Comm.Gather``)."""

    def call(algorithm: str, b: Buffers, comm: MPI.Comm, options: Options) -> None:
        getattr(api, name)(b.x, root=0, out=b.out, algorithm=algorithm, comm=comm,
                           options=options)

    def mpi(b: Buffers, comm: MPI.Comm) -> None:
        mpi_call(comm, b.x, b.out, root=0)

    return {"call": call, "mpi": mpi}


def pattern(count: int, dtype: np.dtype, rank: int) -> np.ndarray:
    """Small integers (exact in every dtype, wrapping alike everywhere) that differ by rank."""
    return ((np.arange(count) % 7 + 1) * (rank % 3 + 1)).astype(dtype)


def column_label(name: str) -> str:
    """Column title of an algorithm's latency in ``--algorithm all`` mode (its whole name)."""
    return f"{name}(us)"


def _titles(args, names: list[str], sent_names: list[str]) -> list[str]:
    """The columns of ``--algorithm all``: latencies, bus bandwidths, kilobytes sent per call."""
    return ([column_label(n) for n in names] + ([f"{n}(GB/s)" for n in names] if args.busbw else [])
            + [f"{n}(kB)" for n in sent_names])


def _names(spec: Spec, chosen: str, dtype: np.dtype) -> list[str]:
    if chosen == "all":
        bare = [MPI_COLUMN] if spec.mpi is not None and dtype in _MPI_KINDS else []
        return bare + ["native"] + [a for a in spec.algorithms if a != "native"]
    if chosen == MPI_COLUMN and spec.mpi is not None:
        if dtype not in _MPI_KINDS:
            raise UsageError(f"--algorithm mpi needs a type MPI has (not {dtype})")
        return [MPI_COLUMN]
    if chosen not in spec.algorithms:
        mpi = f", {MPI_COLUMN}" if spec.mpi is not None else ""
        raise UsageError(f"unknown algorithm {chosen!r}; valid choices: "
                         f"{', '.join(spec.algorithms)}{mpi}, all")
    return [chosen]


def _buffers(spec: Spec, count: int, dtype: np.dtype, comm: MPI.Comm, accelerator: str) -> Buffers:
    """The benchmark's buffers, on the device for ``-d cuda``."""
    b = spec.buffers(count, dtype, comm)
    if accelerator == "cpu":
        return b
    x, = to_accelerator(accelerator, b.x)
    return Buffers(x, x if b.out is b.x else to_accelerator(accelerator, b.out)[0])


def _valid(spec: Spec, name: str, count: int, dtype: np.dtype, comm: MPI.Comm,
           options: Options, accelerator: str) -> bool:
    buf = _buffers(spec, count, dtype, comm, accelerator)
    _invoke(spec, name, buf, comm, options)
    ok = bool(np.array_equal(to_host(buf.out), spec.expected(count, dtype, comm)))
    return bool(comm.allreduce(int(ok), op=MPI.MIN))


def _row(args, size: int | None, stats: dict[str, Stat], busbw: dict[str, float],
         valid: dict[str, bool] | None, sent: dict[str, float]) -> str:
    ok = None if valid is None else all(valid.values())
    if len(stats) == 1:
        (name, s), = stats.items()
        values = [s.avg] + ([s.min, s.max] if args.full else []) + \
                 ([busbw[name]] if args.busbw else [])
        line = report.row(size, values, iterations=s.iterations if args.full else None, valid=ok)
    else:
        values = [stats[n].avg for n in stats] + ([busbw[n] for n in stats] if args.busbw else [])
        values += [sent[n] / 1e3 for n in stats if n in sent]
        titles = _titles(args, list(stats), [n for n in stats if n in sent])
        line = report.row(size, values, valid=ok, titles=titles)
    return line


def _header(spec: Spec, args, columns: list[str], p: int, out: TextIO,
            bytes_columns: bool = False) -> None:
    extra = [f"Algorithm: {args.algorithm}.", f"Ranks: {p}."]
    for line in report.preamble(spec.title, DATATYPES[args.datatype].mpi_name, extra):
        print(line, file=out)
    if len(columns) == 1:
        titles = ["Avg Latency(us)"] + (["Min Latency(us)", "Max Latency(us)"] if args.full
                                        else []) + (["Bus BW(GB/s)"] if args.busbw else [])
        print(report.column_header(titles, iterations=args.full, validation=args.validation,
                                   size=spec.sized), file=out, flush=True)
        return
    titles = _titles(args, columns, [c for c in columns if c != "memcpy"] if bytes_columns else [])
    print(report.column_header(titles, validation=args.validation, size=spec.sized), file=out,
          flush=True)


def run(spec: Spec, argv: Sequence[str] | None = None, comm: MPI.Comm | None = None,
        out: TextIO | None = None) -> list[Record]:
    """Run the benchmark ``spec`` with command-line ``argv``; return its records on every rank."""
    comm = MPI.COMM_WORLD if comm is None else comm
    out = sys.stdout if out is None else out
    parser = make_parser(spec.prog, f"{spec.title} (OSU-compatible output).",
                         default_max=spec.default_max, algorithm=spec.default_algorithm,
                         algorithms=spec.algorithms, compressed=spec.compressed, rank=comm.rank)
    args = parser.parse_args(argv)
    codecs = getattr(args, "codec", None) or []
    problem = device_error(args.accelerator)
    if problem:
        raise UsageError(problem)
    dtype = DATATYPES[args.datatype].dtype
    names = _names(spec, args.algorithm, dtype if args.accelerator == "cpu" else None)
    if args.memcpy and args.algorithm != "all":
        raise UsageError("--memcpy needs --algorithm all")
    if codecs and dtype.kind != "f":
        raise UsageError(f"--codec needs a float type (-T mpi_float, mpi_double or float16), "
                         f"not {args.datatype}")
    squeezed = compressed.codec_calls(codecs, args.strategy, comm) if codecs else {}
    options = Options.from_env()
    if args.algorithm == "all":
        names = [n for n in names if n == MPI_COLUMN or spec.available(n, comm, options)]
    columns = names + list(squeezed) + (["memcpy"] if args.memcpy else [])
    p = comm.size
    if comm.rank == 0:
        _header(spec, args, columns, p, out, bytes_columns=bool(codecs))
    sizes = [s for s in message_sizes(args) if s // dtype.itemsize] if spec.sized else [0]
    meta = {"benchmark": spec.prog, "ranks": p, "datatype": args.datatype,
            "argv": list(sys.argv if argv is None else argv)}
    with Sweep(spec.prog, args, sizes, comm.rank, out, meta) as sweep:
        records: list[Record] = []
        for size in sizes:
            count = size // dtype.itemsize
            iters, warmup = iterations_for(size, args)
            buf = _buffers(spec, count, dtype, comm, args.accelerator)
            calls = {n: (lambda n=n: _invoke(spec, n, buf, comm, options)) for n in names}
            calls.update({label: (lambda f=f: f(buf.x, buf.out)) for label, f in squeezed.items()})
            if args.memcpy:
                src = buf.x.reshape(-1).view(np.uint8)
                dst = src.copy()
                calls["memcpy"] = lambda: xp(src).copyto(dst, src)
            stats = time_interleaved(calls, iters, warmup, comm)
            valid = ({n: _valid(spec, n, count, dtype, comm, options, args.accelerator)
                      for n in names}
                     if args.validation else None)
            nbytes = count * dtype.itemsize
            sent = {}
            if codecs:
                sent = {n: compressed.bytes_per_call(calls[n], comm)
                        for n in names + list(squeezed)}
                sent.update({n: 2 * nbytes * (p - 1) / p for n in names if not sent[n]})
                for n in squeezed if valid is not None else ():
                    calls[n]()
                    valid[n] = compressed.identical_everywhere(to_host(buf.out), comm)
            bus = {n: report.busbw_gbs(spec.collective if n != "memcpy" else "memcpy",
                                       spec.bus_bytes(nbytes, p), stats[n].avg * 1e-6, p)
                   for n in stats}
            sweep.print(_row(args, nbytes if spec.sized else None, stats, bus, valid, sent))
            for n, s in stats.items():
                algbw = report.algbw_gbs(spec.bus_bytes(nbytes, p), s.avg * 1e-6)
                records.append(Record(spec.prog, n, nbytes, p, args.datatype, s.avg, s.min, s.max,
                                      s.median, s.iterations, algbw, bus[n],
                                      None if valid is None else valid.get(n),
                                      sent.get(n)))
            sweep.size_done(nbytes, records)
        sweep.finish(records)
    return records


def entry_point(spec: Spec, module: str | None = None) -> Callable[..., list[Record]]:
    """``main(argv=None, comm=None, out=None)`` of the benchmark ``spec`` (see :func:`run`); a
    usage error is printed once and ends every rank with ``SystemExit(2)``. ``module``: the
    ``__name__`` of the benchmark's module; ``"__main__"`` (``python -m``) runs the benchmark on
    the command line and exits with its status (as the console script does: ``program``)."""

    def main(argv: Sequence[str] | None = None, comm: MPI.Comm | None = None,
             out: TextIO | None = None) -> list[Record]:
        comm = MPI.COMM_WORLD if comm is None else comm
        with usage_errors(spec.prog, comm.rank):
            return run(spec, argv, comm, out)

    main.__doc__ = f"Run ``{spec.prog}``: {spec.title}, OSU-compatible output."
    if module == "__main__":
        sys.exit(program(spec.prog, main)())
    return main
