"""How long ``import collectives`` takes in a fresh interpreter, with Numba imported lazily (now)
and eagerly (what importing every kernel module at import time costs, as before).

Each case is a fresh ``python -c ...`` process, timed from start to exit (wall clock, and the CPU
time the process used, which a busy shared machine inflates much less); the cases run interleaved,
``--repeats`` rounds, and the table gives medians and the import's share above a bare
interpreter. ``numba on import`` imports the kernel modules right after ``collectives``, which is
what ``import collectives`` did when the codecs imported their kernels at module level.

    python bench/import_time.py --repeats 15 [--json out.json]

``python -X importtime -c "import collectives"`` shows where the time goes, module by module.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

CASES = {
    "python (bare)": "pass",
    "import numpy": "import numpy",
    "from mpi4py import MPI": "from mpi4py import MPI",
    "import compress": "import compress",
    "import collectives": "import collectives",
    "numba on import": ("import collectives, compress._kernels.host, "
                        "collectives.compressed._kernels"),
}


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _run(code: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of a fresh interpreter running ``code``."""
    c0, t0 = _cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0, _cpu() - c0


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15, help="rounds over all cases (default 15)")
    p.add_argument("--json", help="write the medians (seconds) here")
    args = p.parse_args(argv)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in CASES}
    for name, code in CASES.items():  # warm the file cache (and Numba's) once
        _run(code)
    for _ in range(args.repeats):
        for name, code in CASES.items():
            runs[name].append(_run(code))
    wall = {name: statistics.median(w for w, _ in r) for name, r in runs.items()}
    cpu = {name: statistics.median(c for _, c in r) for name, r in runs.items()}
    print(f"fresh interpreter, median of {args.repeats} (interleaved); seconds")
    print(f"{'case':<24} {'wall':>7} {'above bare':>11} {'cpu':>7} {'above bare':>11}")
    for name in CASES:
        print(f"{name:<24} {wall[name]:7.3f} {wall[name] - wall['python (bare)']:11.3f} "
              f"{cpu[name]:7.3f} {cpu[name] - cpu['python (bare)']:11.3f}")
    for what, t in (("wall", wall), ("cpu", cpu)):
        lazy = t["import collectives"] - t["python (bare)"]
        eager = t["numba on import"] - t["python (bare)"]
        print(f"import collectives ({what}): {lazy:.3f} s now, {eager:.3f} s with Numba on import "
              f"({eager / lazy:.1f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"repeats": args.repeats, "median_wall_s": wall, "median_cpu_s": cpu,
                       "python": sys.version.split()[0]}, f, indent=1)
    return wall


if __name__ == "__main__":
    main()
