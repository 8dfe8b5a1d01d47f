"""``collectives.plan --run N [--measure]``: the SGD driver's command lines of the best
configurations, and (``--measure``) their measured step time beside the prediction.

A configuration becomes ``mpiexec -n RANKS [-ppn PER_HOST] python -m collectives.sgd`` with the
driver's flags: ``--mesh dp=D,pp=S,tp=T`` (pp or tp > 1: the driver's hybrid parallelism),
``--micro-batches M --schedule K`` (pp > 1), ``--shard Z`` (ZeRO stage > 0), ``--codec C``, and
``--batch-size G / dp``: the global batch ``G`` split over the data-parallel replicas. Before
running one, the driver's own parser is asked whether it knows every flag; a flag it does not
know (a feature not merged into this installation) is reported and that configuration skipped,
never run with the flag dropped.
Measured is the driver's median step time (``step_median_s`` of its ``--log`` JSON summary).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence, TextIO

from ..parallel.planner import Cluster, Configuration, Prediction, Workload
from ..sgd import cli
from ..tools.launch import mpiexec_command

__all__ = ["command", "driver_flags", "unknown_flags", "shell", "run_all", "TIMEOUT_S"]

#: Seconds one measured run may take.
TIMEOUT_S = 1800


def driver_flags(c: Configuration, dp_batch: int) -> list[str]:
    """The driver's flags of configuration ``c`` (the parallel ones and the batch)."""
    flags = ["--batch-size", str(dp_batch)]
    if c.pp > 1 or c.tp > 1:
        flags += ["--mesh", f"dp={c.dp},pp={c.pp},tp={c.tp}"]
    if c.pp > 1:
        flags += ["--micro-batches", str(c.micro_batches), "--schedule", c.schedule]
    if c.shard:
        flags += ["--shard", str(c.shard)]
    if c.codec != "none":
        flags += ["--codec", c.codec]
    return flags


def command(c: Configuration, w: Workload, model: str | None, hidden: Sequence[int],
            dataset: str, batch_size: int, cl: Cluster, epochs: int) -> list[str]:
    """The argv that runs ``c`` with the SGD driver (``model`` None: ``--hidden``)."""
    launch = ["mpiexec", "-n", str(cl.ranks)]
    if cl.hosts > 1:
        launch += ["-ppn", str(cl.per_host)]
    which = ["--model", model] if model else ["--hidden", ",".join(map(str, hidden))]
    data = ["--dataset", dataset] if dataset != "digits" else []
    return [*launch, "python", "-m", "collectives.sgd", *which, *data,
            *driver_flags(c, w.global_batch // c.dp), "--epochs", str(epochs), "--quiet"]


def unknown_flags(argv: Sequence[str]) -> list[str]:
    """The flags of a driver command line that this installation's driver does not accept."""
    args = list(argv[list(argv).index("collectives.sgd") + 1:])
    _, unknown = cli.parser().parse_known_args(args)
    return [u for u in unknown if u.startswith("--")]


def shell(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _measured(argv: list[str], log: Path) -> float:
    real = [*mpiexec_command(), *argv[1:argv.index("python")], sys.executable,
            *argv[argv.index("python") + 1:], "--log", str(log)]
    done = subprocess.run(real, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"exit status {done.returncode}: {' | '.join(tail)}")
    summary = json.loads(log.read_text())["summary"]
    if summary.get("step_median_s"):
        return float(summary["step_median_s"])
    return float(summary["seconds"]["step"]) / max(1, int(summary["steps"]))


def run_all(predictions: Sequence[Prediction], commands: Sequence[list[str]],
            out: TextIO) -> None:
    """Run each command here and print its prediction against the measured median step."""
    print("\npredicted against measured (median step of the driver):", file=out)
    with tempfile.TemporaryDirectory(prefix="collectives-plan-") as tmp:
        for i, (p, argv) in enumerate(zip(predictions, commands), 1):
            c = p.config
            name = f"#{i} dp {c.dp} pp {c.pp} tp {c.tp} M {c.micro_batches} shard {c.shard} " \
                   f"codec {c.codec}"
            missing = unknown_flags(argv)
            if missing:
                print(f"  {name}: not run: the SGD driver here does not accept "
                      f"{', '.join(missing)} (not in this installation)", file=out)
                continue
            try:
                t = _measured(argv, Path(tmp) / f"run{i}.json")
            except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError,
                    KeyError) as exc:
                print(f"  {name}: failed: {exc}", file=out)
                continue
            print(f"  {name}: predicted {p.step * 1e3:.2f} ms, measured {t * 1e3:.2f} ms "
                  f"(measured / predicted {t / p.step:.2f})", file=out, flush=True)
