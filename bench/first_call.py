"""The first call against a warm one, and where the first call's time goes (Numba compiles).

``mpiexec -n 2 python bench/first_call.py [--cold] [--cases allreduce,compressed] [--preload]
[--set-up] [--json F]``

A first call of a process compiles the Numba kernels it needs, unless Numba's cache holds them:
``NUMBA_CACHE_DIR`` if set, else ``__pycache__`` next to the kernels' sources. ``--cold`` gives
this run a new empty cache directory (rank 0 makes it before Numba is imported, every rank uses
it; removed at the end), so every kernel compiles; without it the run finds what earlier runs or
``python -m collectives warmup`` left in the cache.

Cases, in the order given (default ``mpi,allreduce,compressed``), each on ``--count`` float32
elements (the same every time):

- ``mpi``: the bare ``comm.Allreduce(x, y)`` of mpi4py, outside this library: what MPI's own
  first call costs against its warm one (no Numba in it), ``y`` a new array (``np.empty``);
- ``mpi_inplace``: the bare ``comm.Allreduce(MPI.IN_PLACE, x)``;
- ``allreduce``: ``collectives.allreduce(x)`` (``algorithm="auto"``: ``shm`` on one node): its
  result a new array every call;
- ``inplace``: ``collectives.allreduce(x, out=x)``, as trainers reduce their gradients;
- ``compressed``: ``collectives.compressed_allreduce(x, compress.ErrorFeedback(topk))``: top-k
  (ratio 0.01) with error feedback, its state kept on the communicator.

``--preload`` calls ``collectives.preload`` for float32 and the cases' paths first, timed on its
own (``preload``: what it moved off the first calls); ``--set-up`` passes it the communicator
(``comm=COMM_WORLD``: it also sets the communicator up, collectively).

Each case has arrays of its own, written before the case starts (as a program's data is): what a
first call touches for the first time is its result (``allreduce``, ``compressed``, and ``mpi``'s
``y``) and the library's own memory.

Each case: a barrier, the first call timed alone (rank 0's wall and CPU seconds, and the page
faults it took: ``faults``, memory touched for the first time); while a kernel
compiles in a background thread (the shm allreduce runs on the interpreted round driver
meanwhile), more calls, each
after a barrier (``meanwhile``: their number and median; ``ready``: seconds from the first call's
start until every rank has the kernel); then ``--calls`` warm calls, each after a barrier, of
which the median is reported (``warm``), and the first of them against it (``second/warm``: what
the first call left to the next, such as error feedback's second buffer). ``import numba``
is timed first, on its own (the compile listener below needs it): a user's first call pays it
too, so ``first + import`` is what a program waits at its first call when it imports nothing
else that loads Numba. Every top-level compile is listed per kernel and signature (dtypes) with
its seconds, of which ``self`` excludes the kernels it called that compiled with it; ``loaded``
counts the kernels found in the cache. The machine's load (``os.getloadavg``) is printed at the
start and the end: quote it with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time

CASES = ("mpi", "mpi_inplace", "allreduce", "inplace", "compressed")
#: The library path each case needs loaded (``collectives.preload``'s paths).
PATH_OF = {"allreduce": "allreduce", "inplace": "allreduce", "compressed": "compressed"}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cold", action="store_true", help="a new empty Numba cache for this run")
    ap.add_argument("--cases", default="mpi,allreduce,compressed",
                    help=f"comma-separated, in order, from {', '.join(CASES)}")
    ap.add_argument("--count", type=int, default=1 << 20, help="float32 elements (default 1 Mi)")
    ap.add_argument("--calls", type=int, default=11, help="warm calls per case")
    ap.add_argument("--preload", action="store_true",
                    help="call collectives.preload (float32, the cases' paths) before the cases")
    ap.add_argument("--set-up", action="store_true",
                    help="with --preload: pass it comm=COMM_WORLD (sets the communicator up)")
    ap.add_argument("--json", help="write the results here (rank 0)")
    args = ap.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in args.cases if c not in CASES]
    if bad or not args.cases:
        ap.error(f"--cases takes {', '.join(CASES)}; got {args.cases}")
    if args.set_up and not args.preload:
        ap.error("--set-up goes with --preload")
    return args


class _Compiles:
    """Records Numba's ``numba:compile`` events: top-level kernels with their total and self
    seconds."""

    def __init__(self) -> None:
        from numba.core import event

        class Listener(event.Listener):
            def on_start(inner, ev):  # noqa: N805 - the listener's self is the outer record
                row = {"kernel": _name(ev.data), "depth": len(self.stack), "s": 0.0, "self_s": 0.0}
                self.rows.append(row)  # in the order the compiles start: callers first
                self.stack.append((row, time.perf_counter()))

            def on_end(inner, ev):  # noqa: N805
                row, t0 = self.stack.pop()
                row["s"] = time.perf_counter() - t0
                row["self_s"] += row["s"]
                if self.stack:
                    self.stack[-1][0]["self_s"] -= row["s"]

        self.stack: list = []
        self.rows: list[dict] = []
        event.register("numba:compile", Listener())

    def take(self) -> list[dict]:
        rows, self.rows = self.rows, []
        return rows


def _name(data: dict) -> str:
    fn = data["dispatcher"].py_func
    kinds = []
    for t in data["args"]:
        name = str(getattr(t, "dtype", t))
        if name not in kinds:
            kinds.append(name)
    return f"{fn.__module__}.{fn.__qualname__}({', '.join(kinds)})"


def _cache_hits() -> int:
    """Kernels of this library loaded from the cache so far in this process."""
    from numba.core.registry import CPUDispatcher

    hits = 0
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(("collectives", "compress")):
            continue
        for obj in list(vars(mod).values()):
            if isinstance(obj, CPUDispatcher):
                hits += sum(obj.stats.cache_hits.values())
    return hits


def _compiling() -> int:
    """Whether a kernel still compiles in a background thread of this process."""
    return int(any(t.name.startswith("collectives: compiling") and t.is_alive()
                   for t in threading.enumerate()))


def _case(name: str, comm, count: int, calls: int, compiles: _Compiles) -> dict:
    import numpy as np
    from mpi4py import MPI

    import collectives
    import compress

    x = np.random.default_rng(comm.rank).standard_normal(count).astype(np.float32)
    if name in ("inplace", "mpi_inplace"):  # values that stay finite through repeated sums
        x[:] = 0.0
    if name == "mpi":
        y = np.empty_like(x)

        def call():
            comm.Allreduce(x, y)
    elif name == "mpi_inplace":
        def call():
            comm.Allreduce(MPI.IN_PLACE, x)
    elif name == "allreduce":
        def call():
            collectives.allreduce(x)
    elif name == "inplace":
        def call():
            collectives.allreduce(x, out=x)
    else:
        memory = compress.ErrorFeedback(compress.from_spec("topk:ratio=0.01"))

        def call():
            collectives.compressed_allreduce(x, memory)
    hits = _cache_hits()
    comm.Barrier()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t, c = time.perf_counter(), time.process_time()
    call()
    first, cpu = time.perf_counter() - t, time.process_time() - c
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    # the shm allreduce compiles in a background thread and runs interpreted meanwhile: calls
    # until every rank's compile is done (the same count on every rank), then the warm ones
    during = []
    while comm.allreduce(_compiling(), op=MPI.MAX) and time.perf_counter() - t < 900:
        comm.Barrier()
        t1 = time.perf_counter()
        call()
        during.append(time.perf_counter() - t1)
    ready = time.perf_counter() - t
    rows = compiles.take()
    loaded = _cache_hits() - hits
    warm = []
    for _ in range(calls):
        comm.Barrier()
        t = time.perf_counter()
        call()
        warm.append(time.perf_counter() - t)
    return {"first_s": first, "first_cpu_s": cpu, "first_faults": faults,
            "warm_s": statistics.median(warm), "second_s": warm[0] if warm else None,
            "during_calls": len(during), "ready_s": ready if during else first,
            "during_s": statistics.median(during) if during else None,
            "compiled": sum(r["depth"] == 0 for r in rows), "loaded": loaded,
            "compile_s": sum(r["s"] for r in rows if r["depth"] == 0), "compiles": rows}


def _print(result: dict) -> None:
    print(f"# first call against a warm one: {result['ranks']} ranks, {result['count']} float32, "
          f"cache {result['cache']}; load {result['load_start']} at start, "
          f"{result['load_end']} at end")
    print(f"# import numba: {result['import_numba_s']:.2f} s")
    if result["preload_s"] is not None:
        with_comm = " with comm=COMM_WORLD" if result["set_up"] else ""
        print(f"# collectives.preload{with_comm}: {result['preload_s']:.2f} s (before the first "
              "calls)")
    print(f"{'# case':<14}{'first(s)':>10}{'+import(s)':>12}{'cpu(s)':>9}{'warm(ms)':>10}"
          f"{'first/warm':>11}{'second/warm':>12}"
          f"{'faults':>8}{'compile(s)':>12}{'compiled':>10}{'loaded':>8}{'ready(s)':>10}"
          f"{'meanwhile':>11}")
    for name, r in result["cases"].items():
        meanwhile = (f"{r['during_calls']} x {r['during_s'] * 1e3:.1f} ms" if r["during_calls"]
                     else "-")
        second = "-" if r.get("second_s") is None else f"{r['second_s'] / r['warm_s']:.1f}x"
        print(f"{name:<14}{r['first_s']:>10.3f}{r['first_s'] + result['import_numba_s']:>12.2f}"
              f"{r['first_cpu_s']:>9.2f}{r['warm_s'] * 1e3:>10.2f}"
              f"{r['first_s'] / r['warm_s']:>10.1f}x{second:>12}"
              f"{r['first_faults']:>8}{r['compile_s']:>12.2f}"
              f"{r['compiled']:>10}{r['loaded']:>8}{r['ready_s']:>10.2f}{meanwhile:>11}")
    for name, r in result["cases"].items():
        if not r["compiles"]:
            continue
        print(f"# {name}: compiles (s: with the kernels compiled for it; self: without)")
        for row in r["compiles"]:  # callers before their callees
            indent = "  " * row["depth"]
            print(f"  {row['s']:>6.2f} {row['self_s']:>6.2f}  {indent}{row['kernel']}")


def main(argv: list[str] | None = None) -> dict:
    args = _parse(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if "numba" in sys.modules:
        raise RuntimeError("Numba was imported before the cache directory was chosen")
    made = None
    if args.cold:
        made = comm.bcast(tempfile.mkdtemp(prefix="numba-cold-") if comm.rank == 0 else None)
        os.environ["NUMBA_CACHE_DIR"] = made
    load_start = [round(v, 2) for v in os.getloadavg()]
    t = time.perf_counter()
    import numba  # noqa: F401 - timed: every first call pays it

    import_s = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
    compiles = _Compiles()
    preload_s = None
    if args.preload:
        import collectives

        comm.Barrier()
        t = time.perf_counter()
        paths = list(dict.fromkeys(PATH_OF[c] for c in args.cases if c in PATH_OF))
        collectives.preload(("float32",), paths, comm=comm if args.set_up else None)
        preload_s = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
        compiles.take()
    cases = {name: _case(name, comm, args.count, args.calls, compiles) for name in args.cases}
    result = {"ranks": comm.size, "count": args.count,
              "cache": "new (--cold)" if args.cold else
              os.environ.get("NUMBA_CACHE_DIR", "__pycache__"),
              "load_start": load_start, "load_end": [round(v, 2) for v in os.getloadavg()],
              "import_numba_s": import_s, "preload_s": preload_s, "set_up": args.set_up,
              "cases": cases}
    comm.Barrier()
    if comm.rank == 0:
        _print(result)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        if made:
            shutil.rmtree(made, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
