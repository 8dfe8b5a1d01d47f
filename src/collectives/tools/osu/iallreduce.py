"""``osu_iallreduce``: how much of a non-blocking allreduce hides behind compute, OSU 7.x style.

``mpiexec -n 2 osu_iallreduce -m 8:16M --algorithm all --compute sleep`` measures, for every
message size S (bytes per rank) and every algorithm (each through ``collectives.iallreduce``
and the progress engine), plus ``mpi`` (the MPI library's own ``MPI_Iallreduce``, progressed only
inside ``Test``/``Wait``), OSU's numbers:

1. *Pure Comm.*: start the operation and wait for it at once, timed per iteration, barrier after;
2. *Overall*: start it, compute for the pure-communication time of this rank (OSU's dummy
   compute, ``-t N`` cuts it into N pieces with a ``test()`` after each), wait; timed likewise.
   *Compute* is the time spent computing, *Coll. Init* in the starting call, *MPI_Test* in the
   tests, *MPI_Wait* in the final wait;
3. ``Overlap(%) = max(0, 100 - 100 (Overall - (Compute - Test)) / Pure Comm.)``, every value
   averaged over iterations, then over ranks, exactly as OSU computes it. ``--json`` also keeps
   the same from per-rank medians over iterations (``*_median_*``), which a shared machine's
   stalls of single iterations do not move.

The compute is ``--compute cpu`` (OSU's C loop as a GIL-free Numba kernel), ``sleep`` (compute
that needs no core: work on a GPU), or ``python`` (a pure-Python loop holding the GIL); see
``_compute.py``. All algorithms are timed in the same loop, one after the other in every
iteration, so load on a shared machine hits them alike. Output: one OSU block per algorithm
(``# Algorithm: NAME.`` before its header), ``--json`` with every value.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence, TextIO

import numpy as np
from mpi4py import MPI

from ...engine import nonblocking
from ..._runtime.mpitypes import native_op, native_type
from ...algorithms import ALGORITHMS
from ...ops import OPS
from ...options import Options
from . import report
from ._compute import COMPUTE, prepare
from .collective import pattern
from .options import DATATYPES, device_error, iterations_for, make_parser, message_sizes, \
    to_accelerator, to_host

__all__ = ["NbcRecord", "overlap_percent", "main", "MPI_NAME"]

#: The MPI library's own MPI_Iallreduce, timed beside the algorithms.
MPI_NAME = "mpi"
TITLE = "Non-blocking Allreduce Latency Test"


@dataclass(frozen=True)
class NbcRecord:
    """One (size, algorithm) point; times in microseconds, averaged over iterations and ranks."""

    benchmark: str
    algorithm: str
    compute: str
    size: int
    ranks: int
    datatype: str
    overall_us: float
    compute_us: float
    init_us: float
    test_us: float
    wait_us: float
    pure_us: float
    overlap_pct: float
    iterations: int
    valid: bool | None = None
    # the same from per-rank medians over iterations (averaged over ranks; compute without the
    # test calls): robust to the stalls a shared machine adds to single iterations
    overall_median_us: float | None = None
    compute_median_us: float | None = None
    pure_median_us: float | None = None
    overlap_median_pct: float | None = None


def overlap_percent(overall: float, compute: float, test: float, pure: float) -> float:
    """OSU's overlap: the share of the pure communication time hidden behind compute."""
    if pure <= 0:
        return 0.0
    return max(0.0, 100.0 - (overall - (compute - test)) / pure * 100.0)


class _Starter:
    """Starts one algorithm's operation on fixed buffers; ``start()`` returns something with
    ``test()`` and ``wait()``."""

    def __init__(self, name: str, x: np.ndarray, out: np.ndarray, comm: MPI.Intracomm,
                 private: MPI.Intracomm, options: Options) -> None:
        if name == MPI_NAME:
            mpi_type, op = native_type(x.dtype), native_op(OPS["sum"], x.dtype)
            send, recv = [x, mpi_type], [out, mpi_type]
            self.start = lambda: _MpiRequest(private.Iallreduce(send, recv, op))
        else:
            self.start = lambda: nonblocking.iallreduce(x, out=out, algorithm=name, comm=comm,
                                                        options=options)


class _MpiRequest:
    """An mpi4py request with the interface of ours."""

    __slots__ = ("request",)

    def __init__(self, request: MPI.Request) -> None:
        self.request = request

    def test(self) -> bool:
        return self.request.Test()

    def wait(self) -> None:
        self.request.Wait()


def _pure(starters: dict[str, _Starter], iterations: int, warmup: int,
          comm: MPI.Comm) -> dict[str, np.ndarray]:
    """Start-and-wait latency per algorithm and iteration on this rank, seconds (OSU's first
    loop)."""
    times = {name: np.zeros(iterations) for name in starters}
    for it in range(warmup + iterations):
        for name, starter in starters.items():
            comm.Barrier()
            t0 = time.perf_counter()
            starter.start().wait()
            elapsed = time.perf_counter() - t0
            if it >= warmup:
                times[name][it - warmup] = elapsed
    return times


def _overlapped(starters: dict[str, _Starter], target: dict[str, float],
                compute: Callable[[float], None], probes: int, iterations: int, warmup: int,
                comm: MPI.Comm) -> dict[str, np.ndarray]:
    """Per algorithm, (overall, compute, init, test, wait) seconds of every iteration, shape
    (iterations, 5) (OSU's second loop)."""
    times = {name: np.zeros((iterations, 5)) for name in starters}
    for it in range(warmup + iterations):
        for name, starter in starters.items():
            comm.Barrier()
            t_start = time.perf_counter()
            request = starter.start()
            t_init = time.perf_counter()
            test_time = 0.0
            if probes:
                piece = target[name] / probes
                for _ in range(probes):
                    compute(piece)
                    t0 = time.perf_counter()
                    request.test()
                    test_time += time.perf_counter() - t0
            else:
                compute(target[name])
            t_comp = time.perf_counter()
            request.wait()
            t_stop = time.perf_counter()
            if it >= warmup:
                times[name][it - warmup] = (t_stop - t_start, t_comp - t_init, t_init - t_start,
                                            test_time, t_stop - t_comp)
    return times


def _names(chosen: str) -> list[str]:
    valid = [*ALGORITHMS, MPI_NAME]
    if chosen == "all":
        return [MPI_NAME, "native"] + [a for a in ALGORITHMS if a != "native"]
    names = chosen.split(",")
    bad = [n for n in names if n not in valid]
    if bad:
        raise SystemExit(f"osu_iallreduce: unknown algorithm {bad[0]!r}; valid choices: "
                         f"{', '.join(valid)}, all (or a comma-separated list)")
    return names


def _block(args, name: str, dtype_name: str, p: int, rows: list[NbcRecord], out: TextIO) -> None:
    """One OSU block: preamble, header, rows."""
    print("", file=out)
    print(f"# OSU MPI {TITLE} v{report.OSU_VERSION}", file=out)
    print("# Overall = Coll. Init + Compute + MPI_Test + MPI_Wait", file=out)
    print("", file=out)
    print(f"# Datatype: {dtype_name}.", file=out)
    print(f"# Algorithm: {name}.", file=out)
    print(f"# Ranks: {p}. Compute: {args.compute}. Tests during compute: {args.probes}.",
          file=out)
    titles = ["Overall(us)", "Compute(us)"]
    if args.full:
        titles += ["Coll. Init(us)", "MPI_Test(us)", "MPI_Wait(us)"]
    titles += ["Pure Comm.(us)", "Overlap(%)"]
    print(report.column_header(titles, validation=args.validation), file=out)
    for r in rows:
        values = [r.overall_us, r.compute_us - r.test_us]
        if args.full:
            values += [r.init_us, r.test_us, r.wait_us]
        values += [r.pure_us, r.overlap_pct]
        print(report.row(r.size, values, valid=r.valid), file=out)
    out.flush()


def run(argv: Sequence[str] | None = None, comm: MPI.Comm | None = None,
        out: TextIO | None = None) -> list[NbcRecord]:
    """Run the benchmark; return the records on every rank (printed by rank 0)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    out = sys.stdout if out is None else out
    parser = make_parser("osu_iallreduce", f"{TITLE} (OSU-compatible output).",
                         default_max=1 << 20, algorithms=[*ALGORITHMS, MPI_NAME])
    parser.add_argument("-t", "--num-test-calls", dest="probes", type=int, default=0,
                        metavar="CALLS", help="test() calls during the dummy compute (OSU -t)")
    parser.add_argument("--compute", choices=list(COMPUTE), default="cpu",
                        help="dummy compute: cpu (GIL-free kernel, OSU's loop), sleep, or "
                             "python (holds the GIL); default cpu")
    args = parser.parse_args(argv)
    problem = device_error(args.accelerator)
    if problem:
        raise SystemExit(f"osu_iallreduce: {problem}")
    if comm.size < 2:
        raise SystemExit("osu_iallreduce: this test requires at least two processes")
    names = _names(args.algorithm)
    dtype = DATATYPES[args.datatype].dtype
    compute = COMPUTE[args.compute]
    prepare(args.compute)
    options = Options.from_env()
    private = comm.Dup()  # MPI_Iallreduce's own communicator
    records: list[NbcRecord] = []
    for size in message_sizes(args):
        count = size // dtype.itemsize
        if count == 0:
            continue
        iters, warmup = iterations_for(size, args)
        x, = to_accelerator(args.accelerator, pattern(count, dtype, comm.rank))
        outs = {n: x * 0 for n in names}
        starters = {n: _Starter(n, x, outs[n], comm, private, options) for n in names}
        comm.Barrier()
        pure = _pure(starters, iters, warmup, comm)
        target = {n: float(t.mean()) for n, t in pure.items()}  # OSU: this rank's mean latency
        phases = _overlapped(starters, target, compute, args.probes, iters, warmup, comm)
        expected = np.sum([pattern(count, dtype, r) for r in range(comm.size)], axis=0,
                          dtype=dtype)
        for n in names:
            t = phases[n]
            local = np.array([*t.mean(axis=0), target[n], np.median(t[:, 0]),
                              np.median(t[:, 1] - t[:, 3]), np.median(pure[n])]) * 1e6
            total = np.empty_like(local)
            comm.Allreduce(local, total, op=MPI.SUM)
            overall, comp, init, test, wait, pure_us, m_overall, m_comp, m_pure = \
                total / comm.size
            valid = None
            if args.validation:
                ok = bool(np.array_equal(to_host(outs[n]), expected))
                valid = bool(comm.allreduce(int(ok), op=MPI.MIN))
            records.append(NbcRecord("osu_iallreduce", n, args.compute, size, comm.size,
                                     args.datatype, overall, comp, init, test, wait, pure_us,
                                     overlap_percent(overall, comp, test, pure_us), iters,
                                     valid, m_overall, m_comp, m_pure,
                                     overlap_percent(m_overall, m_comp, 0.0, m_pure)))
    private.Free()
    if comm.rank == 0:
        for n in names:
            _block(args, n, DATATYPES[args.datatype].mpi_name, comm.size,
                   [r for r in records if r.algorithm == n], out)
        if args.json:
            meta = {"benchmark": "osu_iallreduce", "ranks": comm.size,
                    "datatype": args.datatype, "compute": args.compute,
                    "argv": list(sys.argv if argv is None else argv)}
            with open(args.json, "w") as fh:
                json.dump({**meta, "records": [asdict(r) for r in records]}, fh, indent=1)
                fh.write("\n")
        if args.csv:
            with open(args.csv, "w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=list(asdict(records[0])) if records
                                        else ["benchmark"])
                writer.writeheader()
                writer.writerows(asdict(r) for r in records)
    return records


def main(argv: Sequence[str] | None = None, comm: MPI.Comm | None = None,
         out: TextIO | None = None) -> list[NbcRecord]:
    """Run ``osu_iallreduce`` (see the module docstring)."""
    return run(argv, comm, out)


if __name__ == "__main__":
    main()
