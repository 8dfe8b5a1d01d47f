"""How long ``import collectives`` takes in a fresh interpreter, with Numba imported lazily (now)
and eagerly (what importing every kernel module at import time costs, as before).

Each case is a fresh ``python -c ...`` process, timed from start to exit; the cases run
interleaved, ``--repeats`` rounds, and the table gives medians and the import's share above a bare
interpreter. ``numba on import`` imports the kernel modules right after ``collectives``, which is
what ``import collectives`` did when the codecs imported their kernels at module level.

    python bench/import_time.py --repeats 15 [--json out.json]

``python -X importtime -c "import collectives"`` shows where the time goes, module by module.
"""

from __future__ import annotations

import argparse
import json
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


def _run(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15, help="rounds over all cases (default 15)")
    p.add_argument("--json", help="write the medians (seconds) here")
    args = p.parse_args(argv)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for name, code in CASES.items():  # warm the file cache (and Numba's) once
        _run(code)
    for _ in range(args.repeats):
        for name, code in CASES.items():
            times[name].append(_run(code))
    med = {name: statistics.median(t) for name, t in times.items()}
    bare = med["python (bare)"]
    print(f"fresh interpreter, median of {args.repeats} (interleaved)")
    print(f"{'case':<24} {'seconds':>8} {'above bare':>11}")
    for name, t in med.items():
        print(f"{name:<24} {t:8.3f} {t - bare:11.3f}")
    lazy, eager = med["import collectives"] - bare, med["numba on import"] - bare
    print(f"import collectives: {lazy:.3f} s now, {eager:.3f} s with Numba on import "
          f"({eager / lazy:.1f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"repeats": args.repeats, "median_s": med, "python": sys.version.split()[0]},
                      f, indent=1)
    return med


if __name__ == "__main__":
    main()
