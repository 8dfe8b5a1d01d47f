"""The pipeline bubble measured against (S-1)/(M+S-1), for GPipe and 1F1B.

``mpiexec -n S python bench/pipeline_bubble.py [--microbatches 2-16] [--steps 5] [--work sleep]
[--forward-ms 4] [--json OUT.json]``

Every rank is one stage of one pipeline (``collectives.parallel.pipeline.Pipeline`` over
``COMM_WORLD``); each stage's forward of a micro-batch takes ``--forward-ms`` and its backward
twice that, activations of ``--rows`` x 256 float32 (64 x 256: 64 KiB) travel between the stages with the
library's non-blocking point-to-point. ``--work sleep`` sleeps for that time (the stages need no
core while they "compute", so an oversubscribed machine still runs them side by side);
``--work matmul`` multiplies 64 x 256 by 256 x 256 matrices until the time has passed (real
compute, competing for the cores with the other ranks' waits), with the BLAS threads of each rank
limited to ``cores // ranks`` as the driver's are (threadpoolctl; the emulated cluster's hosts
share this machine's cores; docs/pipeline.md says what more threads did). For every schedule
and M, each
stage runs ``--steps`` steps; a step's bubble is the stage's idle time (waiting for receives,
and at the step's end for the other stages) over the step's time (``StepStats.bubble``).
Reported: the median over steps, then the mean and the largest of the stages, against the
formula and the schedule simulated on paper (``collectives.parallel.pipeline.simulate``, the
same times, messages free); the largest stage's excess over the formula (``+x%``: the issue's
target is within 20 %); and the most micro-batches any stage held at once (``StepStats.peak_held``:
GPipe holds M, 1F1B at most S). M runs from S (fewer micro-batches than stages are refused).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

from collectives.parallel.pipeline import SCHEDULES, Pipeline, build, ideal_bubble, simulate

ROWS, WIDTH = 64, 256


class _Timed:
    """A stage whose forward takes ``f`` seconds and backward ``2 f`` (module docstring)."""

    def __init__(self, f: float, work: str, first: bool, last: bool, rows: int) -> None:
        self.f, self.work, self.first, self.last, self.rows = f, work, first, last, rows
        self.a = np.ones((rows, WIDTH), np.float32)
        self.w = np.full((WIDTH, WIDTH), 1e-3, np.float32)

    def _spend(self, seconds: float) -> None:
        if self.work == "sleep":
            time.sleep(seconds)
            return
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.a @ self.w

    def buffer(self, kind, m):
        return np.empty((self.rows, WIDTH), np.float32)

    def forward(self, m, x):
        self._spend(self.f)
        return None if self.last else self.a

    def backward(self, m, dy):
        self._spend(2 * self.f)
        return None if self.first else self.a


def _range(text: str) -> list[int]:
    """``2-16`` or ``4,8,16`` (or both: ``2-4,8``)."""
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--microbatches", type=_range, default=None, help="e.g. 2-16 (default S-16)")
    p.add_argument("--schedules", default=",".join(SCHEDULES))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--forward-ms", type=float, default=4.0)
    p.add_argument("--rows", type=int, default=ROWS, help=f"activation rows (default {ROWS})")
    p.add_argument("--work", choices=("sleep", "matmul"), default="sleep")
    p.add_argument("--json")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    S, s = comm.size, comm.rank
    if a.work == "matmul":
        from threadpoolctl import threadpool_limits

        threadpool_limits(max(1, (os.cpu_count() or 1) // S))
    f = a.forward_ms / 1e3
    stage = _Timed(f, a.work, s == 0, s == S - 1, a.rows)
    rows = []
    schedules = a.schedules.split(",")
    if s == 0:
        print(f"S = {S} stages (one rank each), forward {a.forward_ms:g} ms, backward "
              f"{2 * a.forward_ms:g} ms per micro-batch, --work {a.work}, {a.steps} steps each; "
              "bubble: idle / step, median over steps, mean (max) over stages", flush=True)
        print("| S | M | (S-1)/(M+S-1) | " + " | ".join(
            f"{n} measured | {n} on paper | {n} over | {n} held" for n in schedules) + " |")
        print("|---|---|---|" + "---|---|---|---|" * len(schedules))
    for m in a.microbatches or range(S, 17):
        row = {"S": S, "M": m, "ideal": ideal_bubble(S, m)}
        for name in schedules:
            with Pipeline(name, m, comm) as pipe:
                pipe.step(stage)  # warm-up
                stats = [pipe.step(stage) for _ in range(a.steps)]
            mine = (statistics.median(st.bubble for st in stats), max(st.peak_held for st in stats))
            every = comm.gather(mine, root=0)
            if s == 0:
                bubbles = [b for b, _ in every]
                row[name] = {"mean": float(np.mean(bubbles)), "max": float(np.max(bubbles)),
                             "stages": bubbles, "held": max(h for _, h in every),
                             "paper": float(np.mean(simulate(build(name, S, m), f, 2 * f)["bubble"]))}
        if s == 0:
            rows.append(row)
            print(f"| {S} | {m} | {100 * row['ideal']:.1f}% | " + " | ".join(
                f"{100 * row[n]['mean']:.1f}% ({100 * row[n]['max']:.1f}%) | "
                f"{100 * row[n]['paper']:.1f}% | {100 * (row[n]['max'] / row['ideal'] - 1):+.0f}% | "
                f"{row[n]['held']}" for n in schedules) + " |", flush=True)
    if s == 0 and a.json:
        with open(a.json, "w") as out:
            json.dump({"args": vars(a), "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
