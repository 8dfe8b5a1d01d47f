"""Time to accuracy: training runs against a reference run, as one Markdown table (and a plot).

Usage::

    python bench/time_to_accuracy.py --reference dense.json topk.json powersgd.json \
        [--plot curves.png]

Every file is a JSON log of ``python -m collectives.sgd --log`` or ``python -m
collectives.torch.train --log`` (``{"summary": ..., "epochs": [...]}``). The target is the
reference's final test accuracy (less ``--within`` percentage points); a run's time to it is
the wall time of the first epoch whose test accuracy reaches it (evaluated once per epoch, so
the time is that epoch's end). The table has,
per run: its final accuracy and the difference from the reference's, the epoch and wall time at
which it reached the target and the ratio to the reference's own time to it, the median step and
its ratio to the reference's, the bytes each rank sent per step (as ``collectives.TRAFFIC``
counted them: not DDP's gloo), and where a step's time went
(compute, encode, decode, the rest of the exchange: waiting for and merging what arrived), per
step. The torch trainer does not split its exchange, so its encoding and decoding are in "wait",
and DDP's allreduce runs inside backward, so its time is in "compute".
``--plot`` draws test accuracy against epochs and wall time (``collectives.sgd.report.plot``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys


def load(path: str) -> dict:
    with open(path) as f:
        log = json.load(f)
    if not isinstance(log, dict) or "summary" not in log or "epochs" not in log:
        raise SystemExit(f"{path}: not a JSON log of collectives.sgd or collectives.torch.train")
    log["name"] = os.path.splitext(os.path.basename(path))[0]
    return log


def median_step(s: dict) -> float:
    """Seconds; the driver logs ``step_median_s``, the torch trainer ``step_ms_median``."""
    return s["step_median_s"] if "step_median_s" in s else s["step_ms_median"] / 1e3


def split(s: dict) -> str:
    """"compute / encode / decode / wait" in milliseconds per step ("-" where not measured; a
    log without the split shows the codec's whole time as "e+d")."""
    t, n = s["seconds"], max(1, s["steps"])
    ms = lambda v: f"{1e3 * v / n:.0f}"  # noqa: E731
    if "exchange" in s:  # the torch trainer: forward+backward, the exchange, the optimizer
        return f"{ms(t['compute'] + t['update'])} / - / - / {ms(t['comm'])}"
    if "encode" in t or not t.get("codec"):
        codec = f"{ms(t.get('encode', 0.0))} / {ms(t.get('decode', 0.0))}"
    else:  # logs of a driver that timed the codec as a whole
        codec = f"e+d {ms(t['codec'])}"
    return f"{ms(t.get('compute', 0.0))} / {codec} / {ms(t.get('comm', 0.0))}"


def reached(log: dict, target: float) -> dict | None:
    """The first epoch record whose test accuracy is at least ``target``."""
    return next((r for r in log["epochs"] if r["test_acc"] >= target - 1e-12), None)


def training_s(record: dict) -> float:
    """Wall seconds to the end of an epoch record without the evaluations up to it (``eval_s``:
    the driver's evaluation clock, the test set and, under gossip, the consensus distance)."""
    return record["wall_s"] - record["eval_s"]


def table(ref: dict, runs: list[dict], within: float = 0.0) -> str:
    final = ref["summary"]["test_acc"]
    target = final - within / 100
    ref_hit = reached(ref, target)
    ref_step = median_step(ref["summary"])
    # the driver's logs say how much of each epoch's wall time was evaluation: a column without it
    evals = ref_hit is not None and all(
        "eval_s" in r for log in [ref, *runs] for r in log["epochs"])
    head = ("| run | final test acc (vs reference) | reached " f"{100 * target:.2f} % at epoch "
            "(wall s) | time ratio | " + ("without evaluation: s (ratio) | " if evals else "")
            + "median step (ratio) | MB sent per rank per step | "
            "compute / encode / decode / wait per step (ms) |")
    rows = [head, "|" + "---|" * (8 if evals else 7)]
    for log in [ref, *runs]:
        s = log["summary"]
        hit = reached(log, target)
        ratio = (f"**{hit['wall_s'] / ref_hit['wall_s']:.2f}x**" if hit and log is not ref
                 else "1 (reference)" if log is ref else "-")
        without = "" if not evals else "- | " if not hit else \
            f"{training_s(hit):.1f} ({training_s(hit) / training_s(ref_hit):.2f}x) | "
        when = f"{hit['epoch']} ({hit['wall_s']:.1f})" if hit else \
            f"not in {len(log['epochs'])} epochs"
        step = median_step(s)
        ms = split(s)
        diff = 100 * (s["test_acc"] - final)
        # nothing counted: DDP's gloo and native MPI are invisible to collectives.TRAFFIC
        sent = f"{s['bytes_mean'] / max(1, s['steps']) / 1e6:.2f}" if s.get("bytes_max", 1) \
            else "not counted"
        rows.append(f"| {log['name']} | {100 * s['test_acc']:.2f} % ({diff:+.2f}) | {when} | "
                    f"{ratio} | {without}{1e3 * step:.1f} ms ({step / ref_step:.3f}x) | "
                    f"{sent} | {ms} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", required=True, help="the run the others are compared with")
    p.add_argument("runs", nargs="*", help="JSON logs")
    p.add_argument("--plot", metavar="PNG", help="curves of every run")
    p.add_argument("--within", type=float, default=0.0, metavar="POINTS",
                   help="the target: the reference's final accuracy less this many percentage "
                        "points (default 0)")
    a = p.parse_args(argv)
    if a.plot and importlib.util.find_spec("matplotlib") is None:
        from collectives.tools import PLOT_INSTALL

        p.error(f"--plot needs matplotlib: {PLOT_INSTALL}")
    if not 0 <= a.within < 100:
        p.error(f"--within takes percentage points from 0 to 100, got {a.within:g}")
    ref, runs = load(a.reference), [load(r) for r in a.runs]
    print(table(ref, runs, a.within))
    if a.plot:
        from collectives.sgd.report import plot

        plot({log["name"]: log["epochs"] for log in [ref, *runs]}, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
