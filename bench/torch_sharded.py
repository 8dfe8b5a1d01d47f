"""Sharded data parallelism in PyTorch, side by side: ours against what a PyTorch user runs.

Run ``mpiexec -n 2 python bench/torch_sharded.py [--hidden 1024] [--batch 64] [--steps 10]
[--rounds 5] [--json FILE]``. One MLP (784-hidden-hidden-10, float32, Adam lr 1e-3) trained on
random data (each rank its own batch) by every configuration of :data:`CONFIGS`:

- ``ShardedOptimizer`` stage 1 (also with ``overlap=True``, and with ``average_grads=True``:
  ``p.grad`` averaged as DDP leaves it), stage 2, stage 2 with ``overlap=True`` and stage 2
  compressed both ways (top-k 1 % with error feedback in the gradients' reduce-scatter, bf16
  parameters in the allgather: ``codec=``, ``param_codec=``) (ours) against
  ``torch.distributed.optim.ZeroRedundancyOptimizer`` under ``DistributedDataParallel`` over
  gloo (ZeRO 1: DDP allreduces the gradients, ZeRO shards the optimizer step and broadcasts the
  parameters);
- ``collectives.torch.fully_shard`` (ours) against ``torch.distributed.fsdp.fully_shard`` (FSDP2)
  over gloo on a CPU ``DeviceMesh``, each Linear a unit, then the root;
- ``DistributedOptimizer`` (our data-parallel allreduce, unsharded) as the reference both
  compare to.

Each configuration is built once; each round then runs ``--steps`` steps of every configuration
in turn (the order rotates from round to round), after a barrier, and records the slowest rank's
mean step time. Rank 0 prints the median over rounds per configuration and its ratio to the torch
peer. A configuration that fails to build or run (FSDP2 where gloo cannot serve it) is reported
with its error instead of a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
from mpi4py import MPI

import collectives.torch as ct


def _mlp(hidden: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def _ours_zero(stage: int, overlap: bool, codec: str | None = None,
               param_codec: str | None = None, average_grads: bool = False) -> Callable:
    def build(hidden: int) -> tuple[torch.nn.Module, Any]:
        model = _mlp(hidden)
        return model, ct.ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=stage,
                                          overlap=overlap, codec=codec,
                                          param_codec=param_codec,
                                          average_grads=average_grads, lr=1e-3)
    return build


def _torch_zero(hidden: int) -> tuple[torch.nn.Module, Any]:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_mlp(hidden))
    return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                          lr=1e-3)


def _ours_fsdp(codec: str | None = None, param_codec: str | None = None) -> Callable:
    def build(hidden: int) -> tuple[torch.nn.Module, Any]:
        model = _mlp(hidden)
        for layer in model:
            ct.fully_shard(layer, codec=codec, param_codec=param_codec)
        ct.fully_shard(model, codec=codec, param_codec=param_codec)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)
    return build


def _torch_fsdp(hidden: int) -> tuple[torch.nn.Module, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _mlp(hidden)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _ours_dp(hidden: int) -> tuple[torch.nn.Module, Any]:
    model = _mlp(hidden)
    opt = ct.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3),
                                  named_parameters=model.named_parameters())
    return model, opt


ZERO = "torch ZeroRedundancyOptimizer + DDP (gloo)"
FSDP2 = "torch FSDP2 fully_shard (gloo)"
#: name -> (builder, the torch peer it is compared with)
CONFIGS: dict[str, tuple[Callable, str | None]] = {
    "ours DistributedOptimizer (allreduce, unsharded)": (_ours_dp, None),
    ZERO: (_torch_zero, None),
    "ours ShardedOptimizer stage 1": (_ours_zero(1, False), ZERO),
    "ours ShardedOptimizer stage 1, overlap": (_ours_zero(1, True), ZERO),
    "ours ShardedOptimizer stage 1, average_grads": (
        _ours_zero(1, False, average_grads=True), ZERO),
    "ours ShardedOptimizer stage 2": (_ours_zero(2, False), ZERO),
    "ours ShardedOptimizer stage 2, overlap": (_ours_zero(2, True), ZERO),
    "ours ShardedOptimizer stage 2, top-k 1% + bf16 params": (
        _ours_zero(2, False, "topk:ratio=0.01", "bf16"), ZERO),
    FSDP2: (_torch_fsdp, None),
    "ours fully_shard": (_ours_fsdp(), FSDP2),
    "ours fully_shard, top-k 1% + bf16 params": (_ours_fsdp("topk:ratio=0.01", "bf16"), FSDP2),
}


def _step(model: torch.nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank")
    ap.add_argument("--steps", type=int, default=10, help="steps per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", help="comma-separated substrings of configuration names")
    ap.add_argument("--json", help="write the rows here (rank 0)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    ct.init_process_group(comm)
    g = torch.Generator().manual_seed(100 + comm.rank)
    x = torch.randn(args.batch, 784, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    names = [n for n in CONFIGS
             if not args.only or any(s in n for s in args.only.split(","))]
    built: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in names:
        try:
            model, opt = CONFIGS[name][0](args.hidden)
            _step(model, opt, x, y)  # warm: buffers, engines, first calls
            built[name] = (model, opt)
        except Exception as exc:  # noqa: BLE001 - reported, the others still run
            errors[name] = f"{type(exc).__name__}: {exc}"
            if comm.rank == 0:
                traceback.print_exc()
        comm.Barrier()
    times: dict[str, list[float]] = {n: [] for n in built}
    order = list(built)
    for r in range(args.rounds):
        k = r % max(len(order), 1)
        for name in order[k:] + order[:k]:
            model, opt = built[name]
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                _step(model, opt, x, y)
            times[name].append(comm.allreduce((time.perf_counter() - t0) / args.steps,
                                              op=MPI.MAX))
    rows = []
    medians = {n: statistics.median(t) for n, t in times.items()}
    for name in names:
        peer = CONFIGS[name][1]
        row: dict[str, Any] = {"config": name, "ranks": comm.size, "hidden": args.hidden,
                               "batch_per_rank": args.batch}
        if name in medians:
            row["median_step_ms"] = round(medians[name] * 1e3, 2)
            if peer in medians:
                row["vs_torch"] = round(medians[name] / medians[peer], 3)
        else:
            row["error"] = errors[name]
        rows.append(row)
    if comm.rank == 0:
        params = sum(p.numel() for p in _mlp(args.hidden).parameters())
        print(f"# {comm.size} ranks, MLP 784-{args.hidden}-{args.hidden}-10 ({params:,} "
              f"parameters), batch {args.batch} per rank, Adam; median over {args.rounds} "
              f"rounds of {args.steps} steps (slowest rank)")
        for row in rows:
            if "error" in row:
                print(f"{row['config']:<52} error: {row['error']}")
            else:
                ratio = f"  {row['vs_torch']:.2f}x torch" if "vs_torch" in row else ""
                print(f"{row['config']:<52} {row['median_step_ms']:9.2f} ms{ratio}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    dist.destroy_process_group()
    return rows


if __name__ == "__main__":
    main()
