"""``collectives.plan --calibrate FILE``: the compute and network model measured inside the launch.

Run under the same launch the configurations will run on (``mpiexec -n R ...``, or
``bench/cluster.py run -- python -m collectives.plan --calibrate FILE ...``), with the planner's
model and ranks. Every rank measures at once, so each kernel is timed under the oversubscription
the SGD driver meets: on an emulated cluster every host's ranks share this machine's cores, and a
rank computing alone is up to ``ranks x threads / cores`` times faster than one computing beside
the others. What it measures (docs/planner.md, "Calibrating inside the launch"):

- **compute**: every layer shape (and the optimizer step) that some valid configuration of the
  planner's workload needs, with the BLAS threads the driver gives a rank
  (:func:`collectives.sgd.driver.limit_threads`). Before each shape a barrier; each rank takes
  the median of its :data:`REPETITIONS` runs, and the file keeps the median over the ranks;
- **network**: one-way times of a ping-pong of 8 bytes and of :data:`PROBE_BYTES` between rank 0
  and the first rank of the next host (``alpha_inter``, ``beta_inter``) and between rank 0 and
  rank 1 on one host (``alpha``, ``beta``), the other ranks waiting in a barrier (as busy as
  ranks waiting for a message in a step). ``alpha`` is the small message's one-way time,
  ``beta`` the large one's extra time per byte;
- **overhead**: the driver's per-micro-batch work outside the matmuls, timed on the driver's own
  :class:`~collectives.sgd.model.MLP`: its forward and backward of a micro-batch minus the sum of
  the layer kernels of the same shapes (Python calls, the loss and softmax, temporaries), per
  layer and per micro-batch at the rows of the data-parallel configuration.

Rank 0 writes a compute cache (:class:`~collectives.parallel.planner.MeasuredCompute`'s format)
tagged with the launch: ``"launch"`` (ranks, hosts, threads) and ``"network"``. The planner then
reads it with ``--compute-cache FILE`` and uses its times as they are (no slowdown factor) and
its network parameters over the defaults and ``--network``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from ..parallel import planner
from ..parallel.planner.compute import FORMAT, measure_layer, measure_update

__all__ = ["shapes", "run", "REPETITIONS", "PROBE_BYTES"]

#: Timed runs per shape on each rank (the median is kept).
REPETITIONS = 7
#: The large message of the ping-pong probes.
PROBE_BYTES = 1 << 20
_PINGS = 9


def shapes(w: planner.Workload, ranks: int, micro_factors, schedule: str) -> list[tuple]:
    """Every (rows, fan_in, fan_out, relu, input_grad) some valid configuration needs."""
    out = set()
    for c in planner.configurations(w, ranks, ("none",), micro_factors, schedule):
        rows = w.global_batch // (c.dp * c.micro_batches)
        for block in w.blocks(c.tp):
            for l in block:
                out.add((rows, l.fan_in, l.fan_out, l.relu, l.input_grad))
    return sorted(out)


def _pingpong(comm, me: int, other: int, nbytes: int) -> float:
    """Median one-way seconds of ``nbytes`` between ranks ``me`` and ``other`` (0 elsewhere)."""
    buf = np.zeros(max(1, nbytes), np.uint8)
    times = []
    for _ in range(_PINGS):
        t0 = time.perf_counter()
        if me < other:
            comm.Send(buf, other, 7)
            comm.Recv(buf, other, 7)
        else:
            comm.Recv(buf, other, 7)
            comm.Send(buf, other, 7)
        times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times[1:])


def _link(comm, a: int, b: int) -> tuple[float, float] | None:
    """(alpha, beta) of the link between ranks ``a`` and ``b``, known on every rank."""
    comm.Barrier()
    fit = None
    if comm.rank in (a, b):
        other = b if comm.rank == a else a
        small = _pingpong(comm, comm.rank, other, 8)
        large = _pingpong(comm, comm.rank, other, PROBE_BYTES)
        fit = (small, max(0.0, large - small) / PROBE_BYTES)
    comm.Barrier()
    return comm.bcast(fit, root=a)


def _overhead(w: planner.Workload, rows: int, threads: int) -> float:
    """Seconds per layer and micro-batch of the driver's MLP beyond its layer kernels."""
    from ..sgd.model import MLP

    model = MLP(list(w.sizes), seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, w.sizes[0]), dtype=np.float32)
    y = rng.integers(0, w.sizes[-1], rows)

    def step():
        model.loss_and_grad(x, y)

    step()
    times = []
    for _ in range(REPETITIONS):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    kernels = 0.0
    for i in range(w.layers):
        f, b = measure_layer(rows, w.sizes[i], w.sizes[i + 1], i < w.layers - 1, i > 0,
                             REPETITIONS)
        kernels += f + b
    return max(0.0, statistics.median(times) - kernels) / w.layers


def run(path: Path, w: planner.Workload, cl: planner.Cluster, micro_factors, schedule: str,
        out) -> int:
    """Measure on every rank of COMM_WORLD; rank 0 writes ``path``. Exit status."""
    from mpi4py import MPI
    from threadpoolctl import threadpool_limits

    from ..sgd.driver import limit_threads

    comm = MPI.COMM_WORLD
    names = comm.allgather(MPI.Get_processor_name())
    hosts = list(dict.fromkeys(names))
    problem = None
    if comm.size != cl.ranks:
        problem = f"--calibrate runs on the launch of --ranks {cl.ranks} ranks, got {comm.size}"
    elif len(hosts) != cl.hosts or any(names.count(h) != cl.per_host for h in hosts) \
            or any(names[r] != hosts[r // cl.per_host] for r in range(comm.size)):
        problem = (f"--hosts {cl.hosts} with {cl.per_host} ranks each, filled host by host, "
                   f"but the launch places the ranks on {names}")
    if problem:
        if comm.rank == 0:
            print(f"collectives.plan: error: {problem}", file=out)
        return 2
    limit_threads(comm.size)
    from threadpoolctl import threadpool_info

    threads = max((i.get("num_threads", 1) for i in threadpool_info()), default=1)
    todo = shapes(w, cl.ranks, micro_factors, schedule)
    times: dict[str, list[float]] = {}
    t_start = time.perf_counter()
    with threadpool_limits(threads):
        for rows, fan_in, fan_out, relu, grad in todo:
            comm.Barrier()
            mine = measure_layer(rows, fan_in, fan_out, relu, grad, REPETITIONS)
            every = comm.gather(mine, root=0)
            if comm.rank == 0:
                key = f"layer {rows} {fan_in} {fan_out} {int(relu)} {int(grad)} threads={threads}"
                times[key] = [statistics.median(t[0] for t in every),
                              statistics.median(t[1] for t in every)]
        comm.Barrier()
        update = comm.gather(measure_update(1 << 20, REPETITIONS), root=0)
        comm.Barrier()
        over = comm.gather(_overhead(w, w.global_batch // cl.ranks, threads), root=0)
    net = {}
    if cl.per_host > 1:
        net["alpha"], net["beta"] = _link(comm, 0, 1)
    if cl.hosts > 1:
        net["alpha_inter"], net["beta_inter"] = _link(comm, 0, cl.per_host)
    if comm.rank == 0:
        times[f"update threads={threads}"] = [statistics.median(update)]
        times[f"overhead threads={threads}"] = [statistics.median(over)]
        launch = {"ranks": comm.size, "hosts": hosts, "threads": threads,
                  "seconds": round(time.perf_counter() - t_start, 1)}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"format": FORMAT, "host": platform.node(),
                                    "numpy": np.__version__, "launch": launch, "network": net,
                                    "times": times}, indent=0))
        print(f"calibrated {len(todo)} layer shapes on {comm.size} ranks at once "
              f"({threads} BLAS thread(s) each, {launch['seconds']} s); network "
              + ", ".join(f"{k} {v * (1e6 if k.startswith('alpha') else 1e9):.3f} "
                          f"{'us' if k.startswith('alpha') else 'ns/B'}" for k, v in net.items())
              + f"; overhead {times[f'overhead threads={threads}'][0] * 1e6:.0f} us per layer and "
              f"micro-batch; wrote {path}", file=out)
    return 0
