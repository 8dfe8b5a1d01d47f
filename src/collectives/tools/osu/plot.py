"""``collectives-plot``: figures and tables from benchmark result files (JSON or CSV).

``collectives-plot RESULTS.json -o fig.png`` draws latency and bus bandwidth against message
size, one line per algorithm (log-log), one row of panels per world size in the file. ``--model TUNING.json`` (or ``--alpha/--beta/--gamma``)
adds the cost model's prediction of each algorithm as a dashed line of the same colour: the
predicted-vs-measured plot. ``--table`` prints instead a Markdown table of every algorithm's
median latency and its ratio to native's from the same run; ``--errors`` (with ``--model``) a
table of the model's prediction against the measurement for every algorithm and size.
``collectives-plot --timeline RUN.json -o run.png [--window START:END]`` draws a timeline
(``collectives.timeline``): ranks as rows, spans coloured by phase. matplotlib is imported only to draw
(the optional extra ``plot``: ``pip install 'mpi-collectives[plot]'``); without it, drawing stops
with one line saying so.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

from ..._runtime.cli import PLOT_INSTALL, Parser, UsageError, program, usage_errors
from ...selection.cost_model import COSTS, Network, from_tuning_file, predict
from .results import Record, read_records

__all__ = ["ratio_table", "error_table", "plot", "main", "script"]


def _by_algorithm(records: Sequence[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(r.algorithm, []).append(r)
    return {k: sorted(v, key=lambda r: r.size) for k, v in out.items()}


def ratio_table(records: Sequence[Record], reference: str | None = None) -> str:
    """Markdown: one row per size, each algorithm's median us and (ratio to ``reference``: by
    default ``mpi``, the bare mpi4py call, where the run has it, else ``native``), under a line
    that says so (the osu_* programs print averages, OSU's convention)."""
    groups = _by_algorithm(records)
    if reference is None:
        reference = "mpi" if "mpi" in groups else "native"
    names = list(groups)
    sizes = sorted({r.size for r in records})
    cell = {(r.algorithm, r.size): r.median_us for r in records}
    lines = [f"Median us per call over the iterations (ratio to {reference}); the osu_* output "
             "shows averages.", "",
             "| bytes | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for size in sizes:
        ref = cell.get((reference, size))
        cells = []
        for name in names:
            t = cell.get((name, size))
            ratio = f" ({t / ref:.2f})" if t is not None and ref else ""
            cells.append("" if t is None else f"{t:.1f}{ratio}")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def error_table(records: Sequence[Record], net: Network, large: int = 1 << 20) -> str:
    """Markdown: for each size, each modelled algorithm's prediction over its measured median
    (1.00: exact; 0.50: the model says half the time), then per algorithm the "typical error":
    the factor ``2 ** median |log2 ratio|``, over every size and over the sizes >= ``large``."""
    import math

    import numpy as np

    groups = {k: v for k, v in _by_algorithm(records).items() if k in COSTS}
    names = list(groups)
    sizes = sorted({r.size for rows in groups.values() for r in rows})
    ratios: dict[str, list[float]] = {n: [] for n in names}
    lines = ["| bytes | " + " | ".join(f"{n} meas / pred (us)" for n in names) + " |",
             "|---:|" + "---:|" * len(names)]
    for size in sizes:
        cells = []
        for name in names:
            row = next((r for r in groups[name] if r.size == size), None)
            if row is None:
                cells.append("")
                continue
            pred = predict(name, size, row.ranks, net) * 1e6
            ratios[name].append(pred / row.median_us)
            cells.append(f"{row.median_us:.0f} / {pred:.0f} ({pred / row.median_us:.2f})")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    def typical(name: str, least: int) -> str:
        rows = sorted(r.size for r in groups[name])
        errs = sorted(abs(math.log2(x)) for x, n in zip(ratios[name], rows) if x > 0 and n >= least)
        return f"{2 ** float(np.median(errs)):.2f}x" if errs else ""

    for label, least in (("typical error", 0), (f"typical error from {large} B", large)):
        lines.append(f"| {label} | " + " | ".join(typical(n, least) for n in names) + " |")
    return "\n".join(lines)


def plot(records: Sequence[Record], output: str | Path, net: Network | None = None,
         title: str | None = None) -> Path:
    """Latency and bus bandwidth vs size per algorithm (plus predictions) into a PNG: one row of
    the two panels per world size in ``records``; ``mpi`` (a bare MPI call, measured beside ours by
    ``bench/allreduce_sweep.py``) is the thick black line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({r.ranks for r in records}) or [0]
    fig, axes = plt.subplots(len(worlds), 2, figsize=(13, 4.6 * len(worlds) + 0.4), squeeze=False)
    colors: dict[str, str] = {}
    for (lat, bw), p in zip(axes, worlds):
        for name, rows in _by_algorithm([r for r in records if r.ranks == p]).items():
            if name == "mpi":
                style = dict(color="black", lw=2.4, zorder=3, label="mpi (bare comm.Allreduce)")
            else:
                color = colors.setdefault(name, f"C{len(colors) % 10}")
                style = dict(color=color, lw=1.3, label=name)
            sizes = [r.size for r in rows]
            lat.loglog(sizes, [r.median_us for r in rows], "o-", ms=3.5, **style)
            bw.semilogx(sizes, [r.busbw_gbs for r in rows], "o-", ms=3.5, **style)
            if net is not None and name in COSTS:
                lat.loglog(sizes, [predict(name, s, p, net) * 1e6 for s in sizes], "--",
                           color=style["color"], alpha=0.7)
        lat.set(xlabel="message size (bytes)", ylabel="median latency (us)")
        bw.set(xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)")
        if len(worlds) > 1:
            lat.set_title(f"p = {p}", loc="left", fontsize=10)
        for ax in (lat, bw):
            ax.grid(True, which="both", alpha=0.3)
        lat.legend(fontsize=8)
    bench = records[0].benchmark if records else ""
    ranks = ", ".join(str(p) for p in worlds) if records else "?"
    fig.suptitle(title or f"{bench}, p = {ranks}" + (" (dashed: model)" if net is not None else ""))
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return Path(output)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``collectives-plot`` (a usage error: one line, exit status 2)."""
    with usage_errors("collectives-plot", rank=0):
        _main(argv)


def _main(argv: Sequence[str] | None) -> None:
    ap = Parser(prog="collectives-plot", description=__doc__.split("\n\n")[0], rank=0)
    ap.add_argument("results", nargs="?", help="a JSON or CSV file written with --json/--csv")
    ap.add_argument("--timeline", metavar="RUN.json",
                    help="draw a timeline (collectives.timeline) instead: ranks as rows")
    ap.add_argument("--window", metavar="START:END",
                    help="with --timeline: only this stretch, in ms")
    ap.add_argument("-o", "--output", help="PNG to write (default: RESULTS with .png)")
    ap.add_argument("--table", action="store_true", help="print the ratio table, no figure")
    ap.add_argument("--errors", action="store_true",
                    help="with --model: print the prediction-against-measurement table")
    ap.add_argument("--model", help="tuning file whose fitted model to overlay")
    ap.add_argument("--alpha", type=float)
    ap.add_argument("--beta", type=float)
    ap.add_argument("--gamma", type=float)
    ap.add_argument("--title")
    args = ap.parse_args(argv)
    if args.timeline:
        _timeline(args)
        return
    if args.results is None:
        raise UsageError("give a results file (or --timeline RUN.json)")
    if args.errors and not args.model:
        raise UsageError("--errors needs --model TUNING.json (the fitted model to compare)")
    if not (args.table or args.errors) and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"drawing needs matplotlib: {PLOT_INSTALL}; or --table for a table")
    records = read_records(args.results)
    if args.table:
        print(ratio_table(records))
        return
    net = None
    if args.model:
        try:
            net = from_tuning_file(args.model, records[0].ranks)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--model {args.model}: {exc}") from None
    if args.errors:
        print(error_table(records, net))
        return
    if args.alpha is not None or args.beta is not None or args.gamma is not None:
        base = net or Network(0.0, 0.0, 0.0)
        net = Network(alpha=args.alpha if args.alpha is not None else base.alpha,
                      beta=args.beta if args.beta is not None else base.beta,
                      gamma=args.gamma if args.gamma is not None else base.gamma,
                      alpha_native=base.alpha_native, segment_bytes=base.segment_bytes)
    out = plot(records, args.output or Path(args.results).with_suffix(".png"), net, args.title)
    print(f"wrote {out}")


def _timeline(args) -> None:
    """``--timeline RUN.json [-o RUN.png] [--window START:END]``."""
    from ...diagnostics.timeline import chrome
    from ...diagnostics.timeline.plot import plot_timeline

    if args.results is not None:
        raise UsageError("--timeline takes no results file")
    window = None
    if args.window:
        try:
            lo, hi = (float(v) for v in args.window.split(":"))
        except ValueError:
            raise UsageError(f"--window must be START:END in ms, got {args.window!r}") from None
        if not hi > lo:
            raise UsageError(f"--window {args.window}: END must be above START")
        window = (lo, hi)
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"drawing needs matplotlib: {PLOT_INSTALL}")
    try:
        doc = chrome.read(args.timeline)
        out = plot_timeline(doc, args.output or Path(args.timeline).with_suffix(".png"), window,
                            args.title)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--timeline {args.timeline}: {exc}") from None
    print(f"wrote {out}")


#: Console script ``collectives-plot`` (``_runtime.cli.program``: an error is one line, exit 1).
script = program("collectives-plot", main)

if __name__ == "__main__":
    import sys

    sys.exit(script())
