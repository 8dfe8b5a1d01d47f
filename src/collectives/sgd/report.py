"""What a run tells its user: per-epoch lines, the final report, log files and curves.

- :func:`epoch_line`: one line per epoch (loss, train and test accuracy, wall time).
- :func:`final_report`: where the time went (compute, encode/decode, communication, evaluation),
  what each rank sent, against what dense fp32 ring allreduce would have sent, and the peak
  memory per rank by category (:func:`memory_lines`).
- :data:`WRITERS`: ``--log`` by extension, ``.csv`` or ``.json``.
- :func:`plot`: loss and test accuracy against epochs and wall time, and the consensus
  distance against wall time where a run has one (gossip), one line per run
  (matplotlib, imported only when a plot is asked for). ``python -m collectives.sgd.report
  OUT.png A.json B.json ...`` draws several runs' JSON logs in one picture.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import sys
from typing import Any, Callable, Sequence

__all__ = ["epoch_line", "final_report", "memory_lines", "MEMORY_LABELS", "WRITERS", "write_log", "plot", "main"]


def epoch_line(r: dict) -> str:
    spread = f"  consensus {r['consensus']:.3g}" if "consensus" in r else ""
    return (f"epoch {r['epoch']:3d}  loss {r['loss']:.4f}  train {100 * r['train_acc']:6.2f}%  "
            f"test {100 * r['test_acc']:6.2f}%{spread}  {r['wall_s']:7.1f} s")


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB"


def _sync(spec: str) -> str:
    """``--sync`` in words: "sync", "local:H", "gossip:GRAPH", "ssp:S", "async", "sgp",
    "adpsgd"."""
    if spec.startswith("local:"):
        return f"local SGD (parameters averaged every {spec.split(':', 1)[1]} steps)"
    if spec.startswith("gossip:"):
        return (f"gossip SGD (D-PSGD: parameters mixed with the neighbors' every step, graph "
                f"{spec.split(':', 1)[1]}; with a codec: CHOCO-SGD's compressed gossip)")
    if spec.startswith("ssp:"):
        return (f"stale-synchronous SGD (a parameter server; no rank more than "
                f"{spec.split(':', 1)[1]} steps ahead of the slowest)")
    if spec in ("sgp", "sgp:overlap"):
        return ("stochastic gradient push (push-sum over the one-peer exponential graph"
                + (", rounds overlapped)" if spec == "sgp:overlap" else ")"))
    if spec == "adpsgd" or spec.startswith("adpsgd:"):
        return (f"AD-PSGD (asynchronous pairwise averaging with a random neighbor, graph "
                f"{spec.partition(':')[2] or 'ring'})")
    if spec == "async":
        return "asynchronous SGD (a parameter server, no staleness bound)"
    return "synchronous SGD (gradients averaged every step)"


#: what each mesh axis carries, for the report
AXES = {"dp": "gradient exchange", "pp": "activations and their gradients to the neighbor "
        "stages; seconds: waiting for them, the bubble included",
        "tp": "allreduces inside the split layer pairs, within compute"}


def _mesh(s: dict) -> list[str]:
    """A mesh run's lines: its shape, per axis the communication's seconds and bytes per rank,
    and per stage its layers, bubble and memory."""
    m, p = s["mesh"], s["pipeline"]
    lines = [f"mesh dp {m['dp']} x pp {m['pp']} x tp {m['tp']}: {p['stages']} stages x "
             f"{p['replicas']} data-parallel replicas, each layer pair split over {m['tp']} "
             f"ranks; {p['schedule']}, {p['microbatches']} micro-batches; bubble "
             f"(S-1)/(M+S-1) = {100 * p['ideal_bubble']:.1f}%",
             "  per axis (mean per rank): seconds, bytes sent (max of one rank)"]
    for axis, what in AXES.items():
        x = s["axes"][axis]
        lines.append(f"  {axis}: {x['seconds']:8.2f} s  {_mb(x['bytes'])} ({_mb(x['bytes_max'])})"
                     f"  {what}")
    for k, st in enumerate(p["per_stage"]):
        a, b = st["layers"]
        lines.append(f"  stage {k}: layers {a}-{b - 1}, {st['params']:,} parameters, bubble "
                     f"{100 * st['bubble']:5.1f}% (measured: idle / step), peak "
                     f"{st['peak_microbatches']} micro-batches held, "
                     f"{_mb(st['peak_activation_bytes'])} of activations")
    return lines


#: the memory categories of a summary, as the report names them
MEMORY_LABELS = {"parameters": "parameters", "master": "master parameters",
                 "gradients": "gradients",
                 "optimizer": "optimizer state", "codec": "codec state", "buffers": "buffers"}
#: ZeRO stage -> what it shards, in words
SHARDED = {1: "optimizer state", 2: "optimizer state and gradients",
           3: "optimizer state, gradients and parameters"}


def memory_lines(summary: dict) -> list[str]:
    """The report's memory lines: peak bytes per category on the largest rank (tracked arrays:
    ``collectives.parallel.MemoryLedger``) and the process's peak resident set size; the
    master parameters only where a run keeps them (``--shard 1|2 --param-codec``)."""
    m = summary.get("memory")
    if not m:
        return []
    parts = ", ".join(f"{label} {_mb(m[k])}" for k, label in MEMORY_LABELS.items()
                      if k != "master" or m.get(k))
    return [f"peak memory per rank (largest rank): {parts}",
            f"  arrays held at once {_mb(m['total'])}; peak resident set size {_mb(m['rss'])}"]


def final_report(summary: dict) -> str:
    """The report printed by rank 0 at the end of a run."""
    s = summary
    t = s["seconds"]
    total = s["wall_s"]
    how = (f"sharded data parallelism, ZeRO stage {s['shard']} ({SHARDED[s['shard']]} sharded "
           f"over the ranks)" if s.get("shard") else _sync(s["sync"]))
    lines = [
        f"{s['world']} ranks, {s['params']:,} parameters, {s['steps']} steps, codec {s['codec']}, "
        f"algorithm {s['algorithm']}, {how}",
        f"final: loss {s['loss']:.4f}  train {100 * s['train_acc']:.2f}%  "
        f"test {100 * s['test_acc']:.2f}%" + (
            f"  consensus distance {s['consensus']:.3g} (RMS distance of the replicas from "
            f"their average)" if s.get("consensus") is not None else ""),
        f"time (rank 0), {total:.1f} s in all:",
    ]
    for k in ("compute", "codec", "comm", "eval", "checkpoint"):
        label = {"codec": "encode/decode", "comm": "communication"}.get(k, k)
        lines.append(f"  {label:<14} {t.get(k, 0.0):8.2f} s  {100 * t.get(k, 0.0) / total:5.1f}%"
                     + (f"  (encode {t.get('encode', 0.0):.2f} s, decode "
                        f"{t.get('decode', 0.0):.2f} s)" if k == "codec" and t.get(k) else ""))
    if t.get("epoch_wait"):
        lines.append(f"  {'epoch end wait':<14} {t['epoch_wait']:8.2f} s  "
                     f"{100 * t['epoch_wait'] / total:5.1f}%  (the ranks' epochs end apart)")
    if s.get("overlap"):
        busy, hidden = s["comm_busy"], s["comm_hidden"]
        share = f"{100 * hidden / busy:.0f}%" if busy else "-"
        lines.append(f"  overlap: the buckets spent {busy:.2f} s on the engine, {hidden:.2f} s "
                     f"({share}) of it hidden behind backward; {t.get('comm', 0.0):.2f} s "
                     "waited for" + ("; encode/decode ran there too, not on this thread"
                                     if t.get("codec") else ""))
    if s.get("gossip_dtype"):
        lines.append(f"  gossip: the parameters sent as {s['gossip_dtype']} (kept in float32)")
    if s.get("mix_ahead"):
        lines.append(f"  overlap: each gossip round ran during forward and backward; "
                     f"{t.get('comm', 0.0):.2f} s waited for")
    if s.get("auto_report"):
        lines.append(s["auto_report"])
    if s.get("mesh"):
        lines += _mesh(s)
    if t.get("step"):
        lines.append(f"  step (forward, backward, exchange, update): mean "
                     f"{t['step'] / max(1, s['steps']) * 1e3:.1f} ms" + (
                         f", median {s['step_median_s'] * 1e3:.1f} ms"
                         if s.get("step_median_s") else ""))
    server = s.get("sync", "").startswith("ssp:") or s.get("sync") == "async"
    sgp = s.get("sync", "").startswith("sgp")
    pairwise = s.get("sync", "").startswith("adpsgd")
    how = ("analytic n(p-1)/p per push (one-sided puts into the other ranks' shards are not "
           "counted)" if server else
           "analytic n per round (one one-sided message of the parameters)" if sgp else
           "analytic 2n per average (a one-sided get and put of the peer's parameters)"
           if pairwise else
           "analytic 2n(p-1)/p (native MPI_Allreduce is not counted)" if s["analytic"]
           else "counted by collectives.TRAFFIC")
    dense = s["dense_bytes"]
    mean = s["bytes_mean"]
    ratio = ("nothing sent" if not mean else "the same" if abs(dense / mean - 1) < 0.05
             else f"{dense / mean:.1f}x as much" if dense > mean
             else f"{mean / dense:.1f}x less than this run")
    lines += [
        f"bytes sent per rank in {s['exchanges']} exchanges ({how}): mean {_mb(s['bytes_mean'])}, "
        f"max {_mb(s['bytes_max'])}",
        f"  dense fp32 ring allreduce would send {_mb(dense)} per rank: {ratio}",
    ]
    return "\n".join(lines + memory_lines(s))


def _write_csv(path: str, records: Sequence[dict], summary: dict) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(records[0]) if records else ["epoch"])
        w.writeheader()
        w.writerows(records)


def _write_json(path: str, records: Sequence[dict], summary: dict) -> None:
    with open(path, "w") as f:
        json.dump({"summary": summary, "epochs": list(records)}, f, indent=1)


#: log file extension -> writer(path, records, summary)
WRITERS: dict[str, Callable[[str, Sequence[dict], dict], None]] = {
    ".csv": _write_csv, ".json": _write_json}


def write_log(path: str, records: Sequence[dict], summary: dict) -> None:
    WRITERS[os.path.splitext(path)[1].lower()](path, records, summary)


def plot(runs: dict[str, Sequence[dict]], path: str) -> None:
    """Curves of every run in ``runs`` (label -> epoch records) into the PNG ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(runs)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(runs: dict[str, Sequence[dict]]) -> Any:
    """The matplotlib figure of :func:`plot`: loss and test accuracy by epoch, accuracy (and, for
    decentralized runs, the replicas' consensus distance) by wall time from the start of
    training; one curve per run, named by its label in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spread = any("consensus" in r for recs in runs.values() for r in recs)
    fig, axes = plt.subplots(1, 4 if spread else 3, figsize=(20 if spread else 15, 4.2))
    labels = [("epoch", "training loss"), ("epoch", "test accuracy (%)"),
              ("wall time (s)", "test accuracy (%)")]
    for label, recs in runs.items():
        ep = [r["epoch"] for r in recs]
        axes[0].plot(ep, [r["loss"] for r in recs], label=label)
        axes[1].plot(ep, [100 * r["test_acc"] for r in recs], label=label)
        axes[2].plot([r["wall_s"] for r in recs], [100 * r["test_acc"] for r in recs], label=label)
        if spread:  # decentralized runs: how far the replicas are from their average
            kept = [r for r in recs if "consensus" in r]
            axes[3].plot([r["wall_s"] for r in kept], [r["consensus"] for r in kept],
                         label=label)
    if spread:
        labels.append(("wall time (s)", "consensus distance"))
        axes[3].set_yscale("log")
    for ax, (x, y) in zip(axes, labels):
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
        if x == "wall time (s)":  # from the start of training, not from the first epoch's end
            ax.set_xlim(left=0)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    """``python -m collectives.sgd.report OUT.png RUN.json [RUN.json ...]``"""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    if importlib.util.find_spec("matplotlib") is None:
        from .._runtime.cli import PLOT_INSTALL

        print(f"collectives.sgd.report: error: drawing needs matplotlib: {PLOT_INSTALL}",
              file=sys.stderr)
        return 2
    runs = {}
    for path in argv[1:]:
        with open(path) as f:
            log = json.load(f)
        runs[log["summary"].get("label") or os.path.basename(path)] = log["epochs"]
    plot(runs, argv[0])
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    from .._runtime.cli import program

    sys.exit(program("collectives.sgd.report", main)())
