"""A PyTorch trainer on the bundled digits data: ``mpiexec -n 4 python -m collectives.torch.train``.

A small CNN (``--convs`` 3x3 convolutions of ``--width`` channels, two by default, 2x2
max-pooling, a hidden layer of ``--hidden`` units) on the 8x8 digit images of ``collectives.sgd``'s data sets, trained with
synchronous SGD: every rank takes its shard of the same global batch (PyTorch's
``DistributedSampler`` order, ``collectives.sgd.data``), so a run on p ranks sees the samples of a
one-process run with the same ``--batch-size`` (global), step for step. The gradient exchange is
one of:

- ``--exchange overlap`` (default): :func:`collectives.torch.DistributedOptimizer`, buckets'
  (compressed) allreduces started during backward;
- ``--exchange blocking``: the same optimizer's buckets, but all started after backward and
  waited for at once (one fused allreduce when the model fits one bucket): the baseline of the
  overlap;
- ``--exchange ddp``: ``torch.nn.parallel.DistributedDataParallel`` over gloo
  (:func:`collectives.torch.init_process_group`), with its own allreduce, or with ``--ddp-hook``
  through :func:`collectives.torch.comm_hook` and the chosen algorithm and codec.

Rank 0 prints the NumPy driver's report: accuracy, the time split, bytes sent per rank.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

import collectives
from collectives.sgd.datasets import DATASETS, load
from collectives.sgd.data import shard, steps_per_epoch
from collectives.sgd.driver import limit_threads
from collectives.sgd.report import WRITERS, write_log

from .ddp import CommHookState, comm_hook, init_process_group
from .functions import broadcast_parameters
from .optimizer import DistributedOptimizer

__all__ = ["main", "make_model"]

EXCHANGES = ("overlap", "blocking", "ddp")


def make_model(width: int, hidden: int, classes: int, seed: int,
               convs: int = 2) -> torch.nn.Module:
    """The CNN, initialised from ``seed`` (the same on every rank, and broadcast anyway)."""
    if convs < 1:
        raise ValueError(f"convs must be at least 1, got {convs}")
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Unflatten(1, (1, 8, 8))]
    for k in range(convs):
        layers += [torch.nn.Conv2d(1 if k == 0 else width, width, 3, padding=1), torch.nn.ReLU()]
    return torch.nn.Sequential(
        *layers,
        torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(width * 16, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m collectives.torch.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="digits", choices=list(DATASETS))
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64, help="global batch (all ranks together)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--width", type=int, default=16, help="convolution channels")
    p.add_argument("--convs", type=int, default=2,
                   help="3x3 convolutions before the pooling (their compute comes after the "
                        "hidden layer's gradient in backward)")
    p.add_argument("--hidden", type=int, default=64, help="hidden units")
    p.add_argument("--algorithm", default="auto", choices=list(collectives.ALGORITHMS))
    p.add_argument("--codec", default=None, help="codec spec, e.g. topk:ratio=0.01 (default: none)")
    p.add_argument("--error-feedback", action="store_true", help="wrap the codec in error feedback")
    p.add_argument("--strategy", default="auto", help="compressed allreduce strategy")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="fusion bucket size in MiB")
    p.add_argument("--exchange", default="overlap", choices=EXCHANGES)
    p.add_argument("--ddp-hook", action="store_true",
                   help="with --exchange ddp: collectives.torch.comm_hook instead of DDP's allreduce")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--timeline", metavar="FILE",
                   help="write a timeline of every rank's steps and collectives (Chrome trace "
                        "JSON for Perfetto; docs/timeline.md)")
    p.add_argument("--log", metavar="FILE",
                   help="per-epoch log and summary, .json or .csv (collectives.sgd's format: "
                        "python -m collectives.sgd.report draws several)")
    p.add_argument("--quiet", action="store_true", help="only the final report")
    return p


def _accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def main(argv: list[str] | None = None) -> dict:
    """Train; rank 0 prints the report. Returns the summary (every rank)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.log and os.path.splitext(args.log)[1].lower() not in WRITERS:
        parser.error(f"--log {args.log}: the name must end in " + " or ".join(WRITERS))
    torch.set_num_threads(args.threads)
    comm = MPI.COMM_WORLD
    rank, world = comm.rank, comm.size
    # NumPy's BLAS (PowerSGD's products, on the engine thread) gets this rank's share of the
    # cores: OpenBLAS's default of a thread per core, in every rank, spins on the cores the
    # ranks compute on
    limit_threads(world)
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} does not divide among {world} ranks")
    local = args.batch_size // world
    data = load(args.dataset)
    x_train, y_train = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    x_test, y_test = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    if data.features != 64:
        raise SystemExit(f"the CNN takes 8x8 images; {args.dataset} has {data.features} features")
    if args.convs < 1:
        raise SystemExit(f"--convs must be at least 1, got {args.convs}")
    model = make_model(args.width, args.hidden, data.classes, args.seed, args.convs)
    broadcast_parameters(model.state_dict(), root=0, comm=comm)
    n_params = sum(p.numel() for p in model.parameters())
    base = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if args.exchange == "ddp":
        init_process_group(comm)
        model = torch.nn.parallel.DistributedDataParallel(model,
                                                          bucket_cap_mb=args.bucket_mb)
        if args.ddp_hook:
            model.register_comm_hook(CommHookState(
                comm, algorithm=args.algorithm, codec=args.codec,
                error_feedback=args.error_feedback or None, strategy=args.strategy), comm_hook)
        opt = base
    else:
        opt = DistributedOptimizer(base, model.named_parameters(), algorithm=args.algorithm,
                                   codec=args.codec, error_feedback=args.error_feedback or None,
                                   strategy=args.strategy,
                                   bucket_bytes=int(args.bucket_mb * (1 << 20)), comm=comm)
    blocking = args.exchange == "blocking"
    if blocking:
        opt.remove_hooks()  # every bucket starts in synchronize(), after backward
    steps = steps_per_epoch(len(y_train), world, local)
    seconds = {"compute": 0.0, "comm": 0.0, "update": 0.0, "eval": 0.0}
    collectives.TRAFFIC.reset()
    if args.timeline:
        collectives.timeline.start(args.timeline, comm)
    t_start = time.perf_counter()
    step_times = []
    history = []
    for epoch in range(args.epochs):
        order = torch.from_numpy(shard(len(y_train), world, rank, args.seed, epoch))
        total = 0.0
        for s in range(steps):
            idx = order[s * local:(s + 1) * local]
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            t1 = time.perf_counter()
            if args.exchange != "ddp":
                opt.synchronize()
            t2 = time.perf_counter()
            if args.exchange == "ddp":
                opt.step()
            else:
                with opt.skip_synchronize():
                    opt.step()
            t3 = time.perf_counter()
            collectives.timeline.record("forward+backward", t0, t1)  # (nothing when off)
            if args.exchange != "ddp":
                collectives.timeline.record("synchronize", t1, t2)
            collectives.timeline.record("update", t2, t3)
            seconds["compute"] += t1 - t0
            seconds["comm"] += t2 - t1
            seconds["update"] += t3 - t2
            step_times.append(t3 - t0)
            total += float(loss.detach())
        t0 = time.perf_counter()
        net = model.module if args.exchange == "ddp" else model
        record = {"epoch": epoch + 1, "loss": total / max(1, steps),
                  "test_acc": _accuracy(net, x_test, y_test)}
        seconds["eval"] += time.perf_counter() - t0
        record["wall_s"] = time.perf_counter() - t_start
        history.append(record)
        if rank == 0 and not args.quiet:
            print(f"epoch {record['epoch']:3d}  loss {record['loss']:.4f}  "
                  f"test {100 * record['test_acc']:6.2f}%  {record['wall_s']:7.1f} s", flush=True)
    wall = time.perf_counter() - t_start
    if args.timeline:
        written = collectives.timeline.stop()
        if written and not args.quiet:
            print(f"wrote the timeline {written}", flush=True)
    net = model.module if args.exchange == "ddp" else model
    sent = comm.allgather(collectives.TRAFFIC.bytes_sent)
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
    identical = all(b == flat.tobytes() for b in comm.allgather(flat.tobytes()))
    exchange = args.exchange + ("+hook" if args.ddp_hook else "")
    summary = {"label": f"torch {exchange} {args.codec or 'none'}"
                        f"{'+ef' if args.error_feedback else ''} {args.algorithm}",
               "world": world, "params": n_params, "steps": steps * args.epochs,
               "exchange": exchange,
               "algorithm": args.algorithm, "codec": args.codec or "none",
               "test_acc": _accuracy(net, x_test, y_test), "train_acc": _accuracy(net, x_train, y_train),
               "seconds": seconds, "wall_s": wall,
               "step_ms_median": 1e3 * float(np.median(step_times)) if step_times else 0.0,
               "bytes_mean": float(np.mean(sent)), "bytes_max": int(max(sent)),
               "identical": identical}
    if rank == 0:
        print(report(summary), flush=True)
        if args.log:
            write_log(args.log, history, summary)
    if args.exchange == "ddp":
        torch.distributed.destroy_process_group()
    return summary


def report(s: dict) -> str:
    """The final report (the NumPy driver's layout)."""
    total = s["wall_s"]
    lines = [f"{s['world']} ranks, {s['params']:,} parameters, {s['steps']} steps, exchange "
             f"{s['exchange']}, codec {s['codec']}, algorithm {s['algorithm']}",
             f"final: train {100 * s['train_acc']:.2f}%  test {100 * s['test_acc']:.2f}%  "
             f"(parameters bitwise identical on every rank: {s['identical']})",
             f"time (rank 0), {total:.1f} s in all:"]
    for k, label in (("compute", "forward+backward"), ("comm", "communication wait"),
                     ("update", "optimizer step"), ("eval", "eval")):
        t = s["seconds"][k]
        lines.append(f"  {label:<19} {t:8.2f} s  {100 * t / total:5.1f}%")
    lines.append(f"  step: median {s['step_ms_median']:.2f} ms")
    if s["bytes_max"]:
        lines.append(f"bytes sent per rank (collectives.TRAFFIC; DDP's gloo and native MPI are "
                     f"not counted): mean {s['bytes_mean'] / 1e6:,.2f} MB, max "
                     f"{s['bytes_max'] / 1e6:,.2f} MB")
    else:  # every exchange went through MPI's own collectives (auto's native) or gloo
        lines.append("bytes sent per rank: not counted (the exchanges ran in MPI's own "
                     "collectives or DDP's gloo, which collectives.TRAFFIC does not see)")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
