"""``python -m collectives.plan`` (``collectives-plan``): the planner's command line.

Reads the model (``--model``/``--hidden`` of the SGD driver, the data set's input and output
widths), the ranks, hosts and network, measures what the compute model lacks on this machine,
and prints every valid configuration with its predicted step time, fastest first
(:mod:`collectives.parallel.planner`; docs/planner.md). ``--run N`` prints the SGD driver's
command lines of the N best; with ``--measure`` it runs them (:mod:`.measure`). One process,
no MPI traffic: a bad argument is an argparse error (exit status 2).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from ..parallel import planner
from ..parallel.planner.compute import threads_per_rank
from ..selection.cost_model import COSTS
from ..sgd import datasets
from ..sgd.model import MODELS
from . import measure

__all__ = ["parser", "main", "script", "table", "DEFAULT_CODECS"]

PROG = "collectives.plan"
DEFAULT_CODECS = "none,fp16,topk:ratio=0.01"


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(_positive(s) for s in text.split(",") if s.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _rate(text: str) -> str:
    try:
        planner.parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Predict the step time of every data x pipeline x tensor "
        "parallel configuration of the SGD driver's MLP on a network, fastest first.")
    m = p.add_argument_group("model")
    m.add_argument("--model", choices=list(MODELS), default="mlp",
                   help="hidden widths: " + "; ".join(f"{k}={v}" for k, v in MODELS.items()))
    m.add_argument("--hidden", type=_ints, help="hidden widths, e.g. 4096,4096 (over --model)")
    m.add_argument("--dataset", choices=list(datasets.DATASETS), default="digits")
    m.add_argument("--batch-size", type=_positive, default=32,
                   help="per rank of plain data parallelism (the driver's): every configuration "
                        "runs the same global batch, batch-size x ranks (default 32)")
    n = p.add_argument_group("ranks and network")
    n.add_argument("--ranks", type=_positive, required=True)
    n.add_argument("--hosts", type=_positive, default=1,
                   help="hosts the ranks fill one after another (must divide --ranks)")
    n.add_argument("--network", type=_rate, metavar="RATE",
                   help="bandwidth between hosts: 1gbit, 10gbit, 100mbit, ... (default: the "
                        "tuning file's, else 10 Gbit/s)")
    n.add_argument("--tuning", type=Path, metavar="FILE",
                   help="a collectives-tune file whose fitted model gives alpha, beta, gamma")
    n.add_argument("--algorithm", choices=list(COSTS), default="ring",
                   help="the dp and tp allreduce (default ring, the driver's)")
    c = p.add_argument_group("what to consider")
    c.add_argument("--codecs", default=DEFAULT_CODECS,
                   help=f"gradient codecs for dp, comma-separated specs (default {DEFAULT_CODECS})")
    c.add_argument("--micro-factors", type=_ints, default=(1, 2, 4), metavar="F,F",
                   help="micro-batches = pp x F for each F (default 1,2,4)")
    c.add_argument("--schedule", choices=planner.SCHEDULES, default="1f1b",
                   help="pipeline schedule (the same time; 1f1b holds fewer activations)")
    k = p.add_argument_group("compute model")
    k.add_argument("--cores", type=_positive, default=os.cpu_count() or 1,
                   help="cores of a host, shared by its ranks (default this machine's)")
    k.add_argument("--emulated", action="store_true",
                   help="the hosts are emulated on this machine (bench/cluster.py): all ranks "
                        "share its --cores")
    k.add_argument("--compute-cache", default=str(planner.default_cache_path()), metavar="FILE",
                   help="JSON cache of the measured layer times ('none': do not cache; "
                        "default %(default)s), or a file written by --calibrate")
    k.add_argument("--calibrate", type=Path, metavar="FILE",
                   help="run under the launch (mpiexec, bench/cluster.py run): measure the "
                        "compute and links on every rank at once and write FILE, for "
                        "--compute-cache FILE")
    o = p.add_argument_group("output")
    o.add_argument("--top", type=_positive, help="print only the N fastest")
    o.add_argument("--run", type=_positive, metavar="N",
                   help="print the SGD driver's command lines of the N fastest")
    o.add_argument("--measure", action="store_true",
                   help="with --run: run them here and print predicted against measured")
    o.add_argument("--epochs", type=_positive, default=1, help="with --measure (default 1)")
    return p


def _mib(x: float) -> str:
    return f"{x / 2**20:.1f}"


def table(predictions: Sequence[planner.Prediction]) -> str:
    """The rows the command prints (milliseconds and MiB)."""
    head = (f"{'#':>3} {'dp':>3} {'pp':>3} {'tp':>3} {'M':>3} {'shard':>5} {'codec':<16} "
            f"{'step ms':>9} {'compute':>9} {'bubble':>8} {'dp comm':>8} {'pp comm':>8} "
            f"{'tp comm':>8} {'s':>8} {'mem MiB':>8}  params/grads/optim/act MiB")
    lines = [head]
    for i, p in enumerate(predictions, 1):
        c, m = p.config, p.memory
        lines.append(
            f"{i:>3} {c.dp:>3} {c.pp:>3} {c.tp:>3} {c.micro_batches:>3} {c.shard:>5} "
            f"{c.codec:<16} {p.step * 1e3:>9.3f} {p.compute * 1e3:>9.3f} {p.bubble * 1e3:>8.3f} "
            f"{p.dp * 1e3:>8.3f} {p.pp * 1e3:>8.3f} {p.tp * 1e3:>8.3f} {p.driver * 1e3:>8.3f} "
            f"{_mib(m.total):>8}  "
            f"{_mib(m.params)}/{_mib(m.grads)}/{_mib(m.optimizer)}/{_mib(m.activations)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.measure and not a.run:
        p.error("--measure needs --run N")
    hidden = a.hidden or MODELS[a.model]
    data = datasets.load(a.dataset)
    codecs = tuple(s.strip() for s in a.codecs.split(",") if s.strip())
    try:
        w = planner.Workload((data.features, *hidden, data.classes), a.batch_size * a.ranks)
        cl = planner.cluster(a.ranks, a.hosts, a.network, a.tuning)
        if a.calibrate:
            from . import calibrate
            codecs = tuple(s.strip() for s in a.codecs.split(",") if s.strip())
            return calibrate.run(a.calibrate, w, cl, a.micro_factors, a.schedule, sys.stdout,
                                 codecs, a.dataset)
        for spec in codecs:
            planner.codec_of(spec)  # an unknown codec is an error, not an empty table
        threads, slowdown = threads_per_rank(cl.ranks if a.emulated else cl.per_host, a.cores,
                                             cl.ranks)
        cache = None if a.compute_cache.lower() == "none" else Path(a.compute_cache)
        compute = planner.MeasuredCompute(cache, threads, slowdown)
        if compute.launch is not None:
            threads, slowdown = compute.threads, 1.0
            if compute.launch.get("ranks") != a.ranks:
                raise ValueError(f"{cache}: calibrated on {compute.launch.get('ranks')} ranks, "
                                 f"not --ranks {a.ranks}")
            cl = planner.cluster(a.ranks, a.hosts, a.network, a.tuning, compute.network)
        rows = planner.plan(w, cl, compute, codecs, a.micro_factors, a.schedule, a.algorithm,
                            a.tuning)
    except FileNotFoundError as exc:
        p.error(f"{exc.filename}: no such file")
    except (ValueError, OSError) as exc:
        p.error(str(exc))
    net = cl.net
    print(f"model {'x'.join(map(str, w.sizes))} ({a.dataset}), global batch {w.global_batch}, "
          f"{a.ranks} ranks on {a.hosts} host(s); network: {cl.source}")
    print(f"  intra alpha {net.alpha * 1e6:.2f} us, beta {net.beta * 1e9:.4f} ns/B; inter "
          f"alpha {(net.alpha_inter or 0) * 1e6:.1f} us, beta {(net.beta_inter or 0) * 1e9:.3f} "
          f"ns/B; compute: {threads} BLAS thread(s) per rank, "
          + (f"measured inside the launch ({cache}), overhead "
             f"{compute.overhead() * 1e6:.0f} us per layer and micro-batch"
             if compute.launch is not None else
             f"x{slowdown:.2f} for shared cores ({compute.measured} shape(s) measured now"
             + (f", cache {cache})" if cache else ")")))
    print(f"{len(rows)} valid configurations, fastest first")
    print(table(rows[:a.top] if a.top else rows))
    if a.run:
        best = rows[:a.run]
        commands = [measure.command(r.config, w, a.model if a.hidden is None else None, hidden,
                                    a.dataset, a.batch_size, cl, a.epochs) for r in best]
        print(f"\nthe SGD driver's command lines of the {len(best)} fastest:")
        for cmd in commands:
            print("  " + measure.shell(cmd))
        if a.measure:
            measure.run_all(best, commands, sys.stdout)
    return 0


def script() -> None:
    """Console-script entry point (``collectives-plan``)."""
    sys.exit(main())
