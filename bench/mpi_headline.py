"""The headline of docs/benchmarks.md: our allreduce against a bare ``comm.Allreduce``, per MPI.

Run ``python bench/mpi_headline.py LABEL=FILE[,FILE...] [LABEL=...] [--figure PNG]``, each FILE
a JSON of ``bench/allreduce_sweep.py`` (one MPI library, one or more world sizes; its ``mpi``
column is mpi4py's bare ``comm.Allreduce``). Prints a Markdown table, one row per message size
and one column per (MPI, world size): the default call (``auto``) and the fastest of our
hand-written algorithms as time ratios to ``mpi`` of the same run, with the bare call's median.
Several files for one label are repeated runs (at other moments of a shared machine): each
ratio is then the median of the runs' ratios, the default call's with its range across runs,
and the bare call's time the median of its medians. ``--figure`` draws the ratios against size
(matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

#: not "ours" for the best-of column: the yardstick, MPI's algorithm through our wrapper, and the
#: default call (a column of its own)
OURS_SKIP = {"mpi", "native", "auto"}


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def load(path: str) -> dict[tuple[int, int], dict[str, float]]:
    """(world size, bytes) -> {column: median us} of one sweep file."""
    table: dict[tuple[int, int], dict[str, float]] = {}
    for r in json.loads(Path(path).read_text())["records"]:
        table.setdefault((r["ranks"], r["size"]), {})[r["algorithm"]] = r["median_us"]
    return table


def ratios(runs: list[dict[str, float]]) -> tuple[float, float, str, float, float, float]:
    """(auto / mpi, best hand-written / mpi, which, mpi us, lowest and highest auto / mpi) of
    one size, from one or more runs (``{column: median us}`` each): the median over the runs of
    each run's own ratios; "best" the hand-written column whose median ratio is lowest."""
    each = [{k: v / cells["mpi"] for k, v in cells.items()} for cells in runs]
    median = {k: statistics.median(r[k] for r in each) for k in each[0]
              if all(k in r for r in each)}
    ours = {k: v for k, v in median.items() if k not in OURS_SKIP}
    best = min(ours, key=ours.get)
    autos = [r["auto"] for r in each]
    return (median["auto"], ours[best], best, statistics.median(c["mpi"] for c in runs),
            min(autos), max(autos))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", metavar="LABEL=FILE")
    ap.add_argument("--figure", help="also draw the ratios into this PNG")
    args = ap.parse_args(argv)
    series: dict[str, dict[int, tuple[float, float, str, float]]] = {}
    sizes: set[int] = set()
    for spec in args.files:
        label, _, paths = spec.partition("=")
        if not paths:
            ap.error(f"expected LABEL=FILE[,FILE...], got {spec!r}")
        runs = [load(path) for path in paths.split(",")]
        for p, n in sorted(set.intersection(*(set(run) for run in runs))):
            series.setdefault(f"{label} p = {p}", {})[n] = ratios([run[p, n] for run in runs])
            sizes.add(n)
    names = list(series)
    print("| size | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for n in sorted(sizes):
        row = []
        for name in names:
            if n not in series[name]:
                row.append("-")
                continue
            auto, best, which, bare, low, high = series[name][n]
            spread = f" ({low:.2f}-{high:.2f})" if low != high else ""
            row.append(f"**{auto:.2f}x**{spread}; best {best:.2f}x ({which}); "
                       f"mpi {bare:,.1f} us")
        print(f"| {_size(n)} | " + " | ".join(row) + " |")
    if args.figure:
        _figure(series, args.figure)


def _figure(series: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (name, points) in enumerate(series.items()):
        xs = sorted(points)
        color = f"C{i}"
        ax.plot(xs, [points[n][0] for n in xs], "o-", color=color,
                label=f"{name}: default allreduce")
        ax.plot(xs, [points[n][1] for n in xs], "s:", color=color, alpha=0.7,
                label=f"{name}: best of ours")
    ax.axhline(1.0, color="black", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    sizes = sorted({n for points in series.values() for n in points})
    ax.set_xticks(sizes, [_size(n) for n in sizes])
    ax.minorticks_off()
    ratios_seen = [r for points in series.values() for v in points.values() for r in v[:2]]
    ticks = [t for t in (0.125, 0.25, 0.5, 1, 2, 4, 8, 16)
             if min(ratios_seen) / 2 <= t <= max(ratios_seen) * 2]
    ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax.set_xlabel("message size (bytes per rank)")
    ax.set_ylabel("time / bare comm.Allreduce")
    ax.set_title("collectives.allreduce against MPI_Allreduce (below 1: we are faster)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
