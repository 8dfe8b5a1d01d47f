"""collectives.torch.pipelining against torch.distributed.pipelining over gloo, side by side.

``mpiexec -n S python bench/torch_pipeline.py [--layers 8] [--width 512] [--batch 256]
[--microbatches 8] [--schedule 1f1b] [--rounds 7]``

An ``nn.Sequential`` of ``--layers`` Linear(width, width) + ReLU layers and a Linear(width, 10)
head, cut into S equal runs of layers, one per rank; cross-entropy on random data. Both
variants build the same stage (the same parameters) and take turns, one step each per round
(zero_grad, the schedule's step, SGD's step), so that load on a shared machine hits them
alike. Reported: rank 0's median step (ms) of each, and ours over theirs. Theirs runs over the
gloo process group that ``collectives.torch.init_process_group`` sets up from the MPI job.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from mpi4py import MPI

import collectives.torch as ct
from collectives.torch import pipelining


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    S, r = comm.size, comm.rank
    torch.set_num_threads(1)
    torch.manual_seed(0)
    units = [[torch.nn.Linear(a.width, a.width), torch.nn.ReLU()] for _ in range(a.layers)]
    units.append([torch.nn.Linear(a.width, 10)])
    per = len(units) // S
    lo, hi = r * per, (len(units) if r == S - 1 else (r + 1) * per)
    part = torch.nn.Sequential(*[m for u in units[lo:hi] for m in u])
    ct.init_process_group(comm)
    from torch.distributed import pipelining as tp

    loss_fn = torch.nn.functional.cross_entropy
    name = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}[a.schedule]
    ours_part, theirs_part = part, copy.deepcopy(part)
    ours = getattr(pipelining, name)(pipelining.PipelineStage(ours_part, r, S), a.microbatches,
                                     loss_fn=loss_fn)
    theirs = getattr(tp, name)(tp.PipelineStage(theirs_part, r, S, torch.device("cpu")),
                               a.microbatches, loss_fn=loss_fn)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.batch, a.width, generator=g)
    y = torch.randint(0, 10, (a.batch,), generator=g)
    variants = {"collectives": (ours, ours_part), "torch (gloo)": (theirs, theirs_part)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, (_, m) in variants.items()}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(a.rounds + 1):  # the first round warms up
        for k, (schedule, module) in variants.items():
            comm.Barrier()
            t0 = time.perf_counter()
            opts[k].zero_grad()
            if r == 0:
                schedule.step(x)
            elif r == S - 1:
                schedule.step(target=y, losses=[])
            else:
                schedule.step()
            opts[k].step()
            comm.Barrier()
            if i:
                times[k].append(time.perf_counter() - t0)
    ours.close()
    if r == 0:
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"S={S} {a.schedule} M={a.microbatches} layers={a.layers} width={a.width} "
              f"batch={a.batch}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items())
              + f"; collectives / torch = {med['collectives'] / med['torch (gloo)']:.2f}",
              flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
