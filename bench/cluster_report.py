"""Summarise an allreduce sweep on a cluster: hierarchical against the flat algorithms and native.

Usage::

    python bench/cluster_report.py docs/results/cluster/allreduce_2x2_1gbit.json \\
        --model docs/results/cluster/tuning_2x2_1gbit.json [--target 0.6 --from-bytes 1M]

Prints a Markdown table with one row per message size (median microseconds per call, from the
same interleaved run): the fastest column, hierarchical, the best flat algorithm of ours
(ring, tree, recursive doubling, Rabenseifner), native, the ratios hierarchical / best flat and
hierarchical / native, auto / fastest, and the algorithm the fitted two-level model picks (what
``auto`` runs across nodes without tuned rules) with its measured time over the fastest. Then
whether the target holds: hierarchical at most ``--target`` times the best flat algorithm and
native from ``--from-bytes`` up.
"""

from __future__ import annotations

import argparse
import sys


from collectives.tools.osu.options import parse_bytes
from collectives.tools.osu.results import read_records
from collectives.algorithms.auto import algorithm_for
from collectives.selection.cost_model import from_tuning_file

__all__ = ["summary", "main"]

FLAT_OURS = ("ring", "tree", "recursive_doubling", "rabenseifner")


def summary(path: str, model: str | None, target: float, from_bytes: int) -> str:
    records = read_records(path)
    cell = {(r.algorithm, r.size): r.median_us for r in records}
    sizes = sorted({r.size for r in records})
    p = records[0].ranks
    net = from_tuning_file(model, p) if model else None
    head = ["bytes", "fastest", "hierarchical", "best flat (ours)", "native", "hier / best flat",
            "hier / native", "auto / fastest"] + (["model's pick (/ fastest)"] if net else [])
    lines = ["| " + " | ".join(head) + " |", "|---:|---|---:|---|---:|---:|---:|---:|"
             + ("---|" if net else "")]
    misses = []
    for n in sizes:
        row = {a: t for (a, s), t in cell.items() if s == n}
        fastest = min(row, key=row.__getitem__)
        flat = min((a for a in FLAT_OURS if a in row), key=row.__getitem__)
        hier, native = row["hierarchical"], row["native"]
        cells = [str(n), fastest, f"{hier:.1f}", f"{flat} {row[flat]:.1f}", f"{native:.1f}",
                 f"{hier / row[flat]:.2f}", f"{hier / native:.2f}",
                 f"{row['auto'] / row[fastest]:.2f}" if "auto" in row else ""]
        if net:
            pick = algorithm_for(n, n // 4, p, None, net)
            cells.append(f"{pick} ({row[pick] / row[fastest]:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
        if n >= from_bytes and max(hier / row[flat], hier / native) > target:
            misses.append(f"{n} B ({hier / row[flat]:.2f} / {hier / native:.2f})")
    verdict = (f"target hierarchical <= {target}x best flat and native from {from_bytes} B: "
               + ("met" if not misses else "missed at " + ", ".join(misses)))
    return "\n".join(lines) + "\n\n" + verdict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="osu_allreduce --algorithm all --json FILE")
    ap.add_argument("--model", help="tuning file with the fitted model (adds the model's pick)")
    ap.add_argument("--target", type=float, default=0.6)
    ap.add_argument("--from-bytes", type=parse_bytes, default=1 << 20)
    args = ap.parse_args(argv)
    print(summary(args.results, args.model, args.target, args.from_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
