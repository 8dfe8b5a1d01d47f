"""Quick side-by-side sweep of the allreduce algorithms against a bare MPI_Allreduce.

Run ``mpiexec -n P python bench/allreduce_sweep.py [--sizes 8,1024,...] [--node-size 2]
[--algorithms mpi,native,ring,...] [--mode interleaved|evicting|back-to-back] [--json FILE]``.
Every column is timed in one loop (so drift hits them alike), each call after a barrier, the
columns in a new random order each time, the same on every rank (a call finds the caches and
the other rank as the call before it left them: the bare MPI call, for one, slows the call after
it, which a fixed order, or one only rotated, would charge to the same column every time). Rank 0 prints the median over
calls of the slowest rank's time per call (the time the job waits) in microseconds, and each
column's ratio to ``mpi``. The mode says what happens between calls:

- ``interleaved`` (default): the columns alternate, one call each, as a trainer interleaves its
  buckets' allreduces: the arrays are warm, the caches hold what the previous column's call left;
- ``evicting``: as interleaved, and before each call every rank writes over a buffer larger than
  the last-level cache (``--evict-bytes``; default 1.25x the size ``/sys`` gives), as a training
  step's compute does between two steps' allreduces of a gradient: the arrays and the library's
  own buffers come from memory. Slow (a write of that buffer per call): few ``--iterations``;
- ``back-to-back``: ``--chunk`` calls of a column in a row (default 20) before the next column's,
  the same call on the same arrays again: the caches stay warm, the OSU tools' pattern.

- ``mpi``: mpi4py's ``comm.Allreduce(x, y, op=MPI.SUM)`` on a duplicate of COMM_WORLD, outside
  this library: the MPI library's own call, the yardstick;
- every other name is ``collectives.allreduce(x, out=y, algorithm=NAME)`` with default options, as
  a user calls it (``native`` is the same MPI call through the library's dispatcher and failure
  guard; ``hierarchical`` alone gets ``Options(node_size=...)``, its emulated nodes);
- ``NAME:KEY=VALUE[:KEY=VALUE...]``: the algorithm with those options (``KNOBS`` names the keys:
  ``cma`` is ``Options.shm_cma_bytes``, ``seg`` ``shm_segment_bytes``; values are byte counts
  with K/M/G suffixes, or ``never``): ``shm:cma=0`` moves private buffers by cross-memory attach
  at every size, ``shm:cma=never`` through the window's slots only, side by side with ``shm``'s
  default threshold in one loop. Such a column runs on arrays of its own (copies): the library
  remembers one call per arrays, op and algorithm name (``_runtime/repeats.py``), so two columns
  of one algorithm with different options on the same arrays would replace each other's
  remembered call at every call and both pay a first call's path. Compare such columns with
  each other (``shm:cma=4M`` is the default threshold under MPICH), not with ``shm`` or
  ``auto``, whose arrays the other columns share and keep warm. The key ``mem`` puts the
  column's input (``mem=in``), output (``mem=out``) or both (``mem=both``) in shared memory
  (``collectives.empty``): ``shm:cma=never:mem=in`` is the slots' path with nothing to stage,
  ``mem=out`` with nothing to copy out, so that, back to back, each step's cost is the
  difference to ``shm:cma=never`` (docs/benchmarks/shm.md, "Where the time goes").

``--json FILE`` adds this run's records (``collectives.tools.osu.results.Record``, benchmark
``allreduce_sweep``) to FILE, replacing any of the same world size, so runs at several ``P`` make
one file (with each run's command, MPI library and the machine's load average before and after);
``collectives-plot FILE`` draws it (a row of panels per world size). The OSU-compatible
benchmarks (``osu_allreduce``) supersede this for anything but a quick look; docs/algorithms.md
and the README's figure quote it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import collectives
from collectives import mpi_library
from collectives.tools.osu.options import parse_bytes
from collectives.tools.osu.report import algbw_gbs, busbw_gbs
from collectives.tools.osu.results import Record, read_records, write_json

DEFAULT = ["mpi", "native", "ring", "tree", "recursive_doubling", "rabenseifner", "hierarchical"]

#: calls of a column in a row by mode (``--chunk`` overrides back-to-back's)
CHUNK = {"interleaved": 1, "evicting": 1, "back-to-back": 20}

#: a column's option keys (``shm:cma=0``) and the ``Options`` field each sets
KNOBS = {"cma": "shm_cma_bytes", "seg": "shm_segment_bytes"}
#: a byte count above any call (an option value ``never``)
NEVER = 2**63 - 1
#: the key ``mem``'s values: which of the column's arrays are ``collectives.empty`` buffers
SHARED = {"in": (True, False), "out": (False, True), "both": (True, True)}


def column(name: str) -> tuple[str, dict[str, int], str | None]:
    """The algorithm, the options and the ``mem`` value (None: NumPy arrays) of the column
    ``name`` (``shm:cma=4M:mem=in``: ``"shm"``, ``{"shm_cma_bytes": 4194304}`` and ``"in"``).
    Raises ValueError naming the keys for an unknown one."""
    algorithm, *pairs = name.split(":")
    fields, mem = {}, None
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key == "mem" and value in SHARED:
            mem = value
        elif key not in KNOBS or not value:
            raise ValueError(f"column {name!r}: options are KEY=VALUE with KEY one of "
                             f"{', '.join(KNOBS)} (a byte count), or mem={'|'.join(SHARED)}; "
                             f"got {pair!r}")
        else:
            fields[KNOBS[key]] = NEVER if value == "never" else parse_bytes(value)
    return algorithm, fields, mem


def llc_bytes() -> int:
    """The largest cache's size in bytes from ``/sys`` (Linux), else 64 MiB."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=64 << 20)


def evictor(nbytes: int):
    """A call that writes over ``nbytes`` of private memory (none for 0): the evicting mode's
    stand-in for a training step's compute."""
    if nbytes <= 0:
        return lambda: None
    junk = np.empty(nbytes, np.uint8)
    step = itertools.count()
    return lambda: junk.fill(next(step) & 0xFF)


def _save(path: str, records: list[Record], argv: list[str], load: tuple[float, ...],
          mode: str) -> None:
    """Add ``records`` (one world size) to the JSON file ``path``, replacing that size's, with
    the machine's load average before (``load``) and after the run (a shared machine's noise)."""
    p = records[0].ranks
    runs, old = [], []
    if Path(path).exists():
        data = json.loads(Path(path).read_text())
        runs = [r for r in data.get("runs", []) if r.get("ranks") != p]
        old = [r for r in read_records(path) if r.ranks != p]
    runs.append({"ranks": p, "argv": argv, "mode": mode, "mpi_library": str(mpi_library()),
                 "loadavg_before": list(load), "loadavg_after": list(os.getloadavg())})
    runs.sort(key=lambda r: r["ranks"])
    write_json(path, sorted(old + records, key=lambda r: (r.ranks, r.size)),
               benchmark="allreduce_sweep", runs=runs)


def _call(name: str, x: np.ndarray, y: np.ndarray, bare: MPI.Comm, opts: collectives.Options):
    """The column ``name``'s call: the bare MPI call, ``hierarchical`` with the emulated node
    size, an algorithm with options (:func:`column`) with those over the environment's, any
    other algorithm as a user calls it (default options, read from the environment)."""
    if name == "mpi":
        return lambda: bare.Allreduce(x, y, op=MPI.SUM)
    algorithm, fields, mem = column(name)
    if fields or mem:  # on arrays of its own (see the module docstring)
        given = dataclasses.replace(collectives.Options.from_env(), **fields)
        shared_in, shared_out = SHARED.get(mem, (False, False))
        xs = collectives.empty(x.size, x.dtype) if shared_in else np.empty_like(x)
        ys = collectives.empty(y.size, y.dtype) if shared_out else np.empty_like(y)
        xs[:] = x
        return lambda: collectives.allreduce(xs, out=ys, algorithm=algorithm, options=given)
    if name == "hierarchical":
        return lambda: collectives.allreduce(x, out=y, algorithm=name, options=opts)
    return lambda: collectives.allreduce(x, out=y, algorithm=name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,1024,8192,65536,262144,1048576,4194304",
                        help="message sizes in bytes, comma-separated (float32 elements)")
    parser.add_argument("--node-size", type=int, default=2, help="emulated node size (hierarchical)")
    parser.add_argument("--algorithms", default=",".join(DEFAULT),
                        help=f"columns, comma-separated: mpi and the names of "
                             f"collectives.ALGORITHMS (default {','.join(DEFAULT)})")
    parser.add_argument("--iterations", type=int, default=200,
                        help="timed calls per column up to 64 KiB (default 200)")
    parser.add_argument("--iterations-large", type=int, default=20,
                        help="timed calls per column above 64 KiB (default 20)")
    parser.add_argument("--mode", choices=list(CHUNK), default="interleaved",
                        help="what happens between calls (the module docstring; default "
                             "interleaved)")
    parser.add_argument("--chunk", type=int, default=None,
                        help="back-to-back: calls of one column in a row before the next "
                             "column's (default 20)")
    parser.add_argument("--evict-bytes", type=int, default=None,
                        help="evicting: bytes written between calls (default 1.25x the "
                             "last-level cache)")
    parser.add_argument("--json", help="add the medians to this JSON file (see above)")
    args = parser.parse_args()
    names = [a for a in args.algorithms.split(",") if a]
    try:
        unknown = [a for a in names if a != "mpi" and column(a)[0] not in collectives.ALGORITHMS]
    except ValueError as e:
        parser.error(str(e))
    if unknown or "mpi" not in names:
        parser.error(f"--algorithms needs mpi and names of {', '.join(collectives.ALGORITHMS)}"
                     + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    load = os.getloadavg()
    comm = MPI.COMM_WORLD
    bare = comm.Dup()
    opts = collectives.Options(node_size=args.node_size)
    p = comm.size
    chunk = max(1, args.chunk if args.chunk and args.mode == "back-to-back" else CHUNK[args.mode])
    evict_bytes = args.evict_bytes if args.evict_bytes is not None else llc_bytes() * 5 // 4
    evict = evictor(evict_bytes if args.mode == "evicting" else 0)
    if comm.rank == 0:
        how = {"interleaved": "columns alternating", "back-to-back": f"{chunk} calls in a row",
               "evicting": f"columns alternating, {evict_bytes >> 20} MiB written before each"}
        print(f"# p={p}, mode {args.mode} ({how[args.mode]}), median over calls of the slowest "
              f"rank's us per call (ratio to mpi: bare comm.Allreduce)")
        print(f"{'bytes':>9} " + " ".join(f"{a:>22}" for a in names))
    records: list[Record] = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        x = np.ones(max(nbytes // 4, 1), np.float32)
        y = np.empty_like(x)
        calls = {a: _call(a, x, y, bare, opts) for a in names}
        iters = args.iterations if nbytes <= 65536 else args.iterations_large
        times: dict[str, list[float]] = {a: [] for a in names}
        order = list(calls.items())
        shuffle = np.random.default_rng(nbytes).permutation  # the same orders on every rank
        for it in range(0, iters + 5, chunk):
            for k in shuffle(len(order)):  # a new order each time: each column follows each
                a, call = order[k]
                for i in range(it, min(it + chunk, iters + 5)):
                    evict()
                    comm.Barrier()
                    t = time.perf_counter()
                    call()
                    if i >= 5:  # warm-up
                        times[a].append(time.perf_counter() - t)
        # per call, the slowest rank's time (what the job waits for), then statistics over calls
        slowest = {a: np.empty(len(times[a])) for a in names}
        for a in names:
            comm.Allreduce(np.array(times[a]), slowest[a], op=MPI.MAX)
        med = {a: float(np.median(slowest[a])) * 1e6 for a in names}
        avg = {a: float(np.mean(slowest[a])) * 1e6 for a in names}
        lo = {a: float(np.min(slowest[a])) * 1e6 for a in names}
        hi = {a: float(np.max(slowest[a])) * 1e6 for a in names}
        if comm.rank == 0:
            cells = " ".join(f"{med[a]:>13.1f} ({med[a] / med['mpi']:5.2f})" for a in names)
            print(f"{x.nbytes:>9} {cells}", flush=True)
            records += [Record("allreduce_sweep", a, x.nbytes, p, "mpi_float", avg[a], lo[a],
                               hi[a], med[a], iters, algbw_gbs(x.nbytes, med[a] * 1e-6),
                               busbw_gbs("allreduce", x.nbytes, med[a] * 1e-6, p))
                        for a in names]
    if comm.rank == 0 and args.json and records:
        _save(args.json, records, sys.argv, load, args.mode)
    bare.Free()


if __name__ == "__main__":
    from collectives.tools import program

    sys.exit(program("allreduce_sweep", main)())
