"""The calibration's step probe: the waits a step's collectives meet, which back-to-back timing
misses.

:mod:`.calibrate` fits ``alpha`` and ``beta`` to allreduces run back to back, every rank entering
together. In a step a rank reaches each tensor-parallel allreduce right after its own layer
kernels, while a partner may still be computing or waiting for one of the cores the ranks share;
and a pipeline stage hands each micro-batch's activation to its neighbor, whose receive may
wait for the sender to be scheduled again. This probe runs the SGD driver's own stage
(:class:`~collectives.sgd.pipelined.MLPStage`, its pipeline executor and its mesh) for every
mesh ``dp x pp x tp`` some configuration uses, on the whole launch at once, and measures per
mesh:

- **sync** (``w``, seconds per allreduce): every tp allreduce of the step is followed at once by
  a second one of the same bytes on the same group; ``w`` is the mean over the ranks and the
  calls of the first's seconds less the second's. The second starts with every partner just out
  of the first, so the difference is the wait for the partners' compute (the skew between
  them) and their scheduling. On a mesh with data parallelism only, the same for the gradient
  allreduce after each rank's forward and backward (a slice of :data:`DP_PROBE_ELEMENTS`
  floats: the wait does not depend on the bytes);
- **slot** (seconds per pipeline slot): the step's seconds over its ``M + S - 1`` slots less
  the slowest rank's compute per micro-batch (its kernels and tp allreduces, as the executor
  counts them): what a slot costs beyond the stage's own compute, the neighbor messages and
  their hand-offs included, and with one stage the wait at the step's closing barrier.
  :mod:`.calibrate` subtracts the messages the cost model already prices and keeps the rest as
  the hand-off ``h``;
- **stage overhead** (seconds per layer and micro-batch): the stages' compute per micro-batch
  (without the tp allreduces) less the layer kernels of the same shapes, over the layers: the
  driver's ``o`` as its pipelined stage has it (its Python, the loss, the copies), where the
  launch-wide ``o`` is measured on the data-parallel ``MLP``. :mod:`.calibrate` computes it.

- **driver step** (seconds per step, :func:`driver_step`): the SGD driver itself
  (:class:`~collectives.sgd.driver.Trainer`, or its ``PipelinedTrainer`` on a mesh with pp or
  tp), built from the flags ``--run`` gives the configuration of this mesh with the probe's
  micro-batch count, no ZeRO and no codec, its ``one_step`` timed as the driver times it; the
  slowest rank's median. :mod:`.calibrate` subtracts what the planner's other terms predict for
  the same configuration and keeps the rest as the mesh's per-step driver residual ``s``: the
  optimizer step, the batch, the driver's bookkeeping, which the stage probe above never runs.
  Where the mesh has dp > 1 the driver is timed again with each calibrated codec, and on a
  dp-only mesh with ZeRO 2 and 3 (:func:`driver_forms`), each form getting its own ``s``;
  ZeRO 1 runs the dense exchange's calls (ring allreduce's two halves) and takes the dense
  ``s``.

Each mesh runs :data:`STEPS` steps after a warm-up one, with the middle of its configurations'
micro-batch counts (:func:`meshes`) and the planner's global batch; on a pipeline mesh the driver
step is timed again at each of its other counts (:func:`other_counts`). docs/planner.md has the
formulas that use them.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..parallel import planner

__all__ = ["meshes", "other_counts", "probe", "driver_step", "driver_argv", "driver_forms",
           "STEPS", "DP_PROBE_ELEMENTS"]

#: Timed steps per mesh (after one warm-up step).
STEPS = 4
#: Floats of the data-parallel allreduce of a dp-only mesh's probe.
DP_PROBE_ELEMENTS = 1 << 18


def _counts(w: planner.Workload, ranks: int, micro_factors, schedule: str
            ) -> dict[tuple[int, int, int], list[int]]:
    """Every ``(dp, pp, tp)`` of a valid configuration, with its valid micro-batch counts."""
    counts: dict[tuple[int, int, int], set[int]] = {}
    for c in planner.configurations(w, ranks, ("none",), micro_factors, schedule):
        counts.setdefault((c.dp, c.pp, c.tp), set()).add(c.micro_batches)
    return {m: sorted(v) for m, v in sorted(counts.items())}


def meshes(w: planner.Workload, ranks: int, micro_factors, schedule: str
           ) -> list[tuple[int, int, int, int]]:
    """Every ``(dp, pp, tp)`` of a valid configuration but the single rank, with the middle of
    its valid micro-batch counts: ``(dp, pp, tp, M)``."""
    return [(*m, v[len(v) // 2]) for m, v in _counts(w, ranks, micro_factors, schedule).items()
            if m != (1, 1, 1)]


def other_counts(w: planner.Workload, ranks: int, micro_factors, schedule: str
                 ) -> dict[tuple[int, int, int], list[int]]:
    """Each pipeline mesh's (pp > 1) valid micro-batch counts but the middle one
    (:func:`meshes`' ``M``): the counts the driver's step is timed at again (dense, no ZeRO,
    no codec), so that :mod:`.calibrate` fits the mesh's residual ``s`` as a line in the
    count."""
    return {m: [M for M in v if M != v[len(v) // 2]]
            for m, v in _counts(w, ranks, micro_factors, schedule).items() if m[1] > 1}


def driver_forms(mesh: tuple[int, int, int, int], codecs) -> list[tuple[int, str]]:
    """The data-parallel forms whose driver step is timed on ``mesh`` besides the dense one,
    where the mesh has dp > 1: ZeRO stages 2 and 3 on a dp-only mesh (the driver takes them
    there only; ZeRO 1 is derived, :func:`~collectives.parallel.planner.driver_form`), and each
    codec of ``codecs`` (but "none"); ``(shard, codec)`` each."""
    dp, pp, tp, _ = mesh
    if dp < 2:
        return []
    stages = (2, 3) if pp == tp == 1 else ()
    return [(z, "none") for z in stages] + [(0, c) for c in codecs if c != "none"]


def _stage_class():
    from ..api import allreduce
    from ..sgd.pipelined import MLPStage

    class Probe(MLPStage):
        """The driver's stage, each tp allreduce timed and followed by a second one."""

        pairs: list[tuple[float, float]]

        def _allreduce(self, x):
            t0 = time.perf_counter()
            super()._allreduce(x)
            first = time.perf_counter() - t0
            y = x.copy()  # the sum stays in x; the second allreduce sums a copy
            t1 = time.perf_counter()
            allreduce(y, out=y, algorithm=self.algorithm, comm=self.tp)
            self.pairs.append((first, time.perf_counter() - t1))
            return x

    return Probe


def _timed_pair(x, comm, algorithm: str) -> tuple[float, float]:
    from ..api import allreduce

    t0 = time.perf_counter()
    allreduce(x, out=x, algorithm=algorithm, comm=comm)
    t1 = time.perf_counter()
    allreduce(x, out=x, algorithm=algorithm, comm=comm)
    return t1 - t0, time.perf_counter() - t1


def probe(comm, w: planner.Workload, mesh: tuple[int, int, int, int], algorithm: str = "ring",
          steps: int = STEPS) -> dict[str, float]:
    """Collective over ``comm`` (all of the launch): for ``mesh`` on every rank, ``sync``
    (seconds per allreduce), ``slot`` (seconds per pipeline slot beyond the slowest rank's
    compute), ``compute`` (the slowest rank's seconds per micro-batch without its tp
    allreduces), ``stages_compute`` (the same summed over the stages, each stage's the median
    of its ranks: the whole model's per micro-batch), ``step`` and ``micro_batches`` (the
    module docstring)."""
    from mpi4py import MPI

    from ..mesh.mesh import Mesh
    from ..parallel.pipeline import Pipeline
    from ..sgd.pipelined import MESH_AXES, stage_bounds

    dp, pp, tp, M = mesh
    sizes = tuple(w.sizes)
    m = Mesh((dp, pp, tp), names=MESH_AXES, comm=comm)
    s = m.coords()[1]
    bounds = stage_bounds(sizes, pp, None)
    stage = _stage_class()(sizes, bounds[s], bounds[s + 1], 0, m.comm("tp"), algorithm)
    pipe = Pipeline("1f1b", M, m.comm("pp"), world=m.comm()) if pp > 1 or tp > 1 else None
    rows = w.global_batch // dp
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal((rows, sizes[0]), dtype=np.float32)
    y = rng.integers(0, sizes[-1], rows)
    g = np.ones(DP_PROBE_ELEMENTS, np.float32)
    waits: list[float] = []
    steps_s: list[float] = []
    with_tp: list[float] = []
    without_tp: list[float] = []
    try:
        for k in range(steps + 1):
            stage.pairs = []
            stage.begin(x if stage.first else None, y if stage.last else None, rows, M)
            comm.Barrier()
            if pipe is not None:
                st = pipe.step(stage)
                step, comp = st.step_s, st.compute_s
                pair_waits = [a - b for a, b in stage.pairs]
            else:  # data parallelism only: forward, backward, then the gradient's allreduce
                t0 = time.perf_counter()
                stage.backward(0, stage.forward(0, None))
                comp = step = time.perf_counter() - t0
                pair_waits = [a - b for a, b in [_timed_pair(g, m.comm("dp"), algorithm)]]
            if k:  # the first step warms up
                first = sum(a for a, _ in stage.pairs)
                second = sum(b for _, b in stage.pairs)
                waits.extend(pair_waits)
                steps_s.append(step - second)  # the probe's own second allreduces taken out
                with_tp.append(comp - second)
                without_tp.append(comp - first - second)
    finally:
        if pipe is not None:
            pipe.close()
        m.free()
    every = comm.allgather((sum(waits), len(waits)))
    # each stage's compute per micro-batch without its tp allreduces: the median of its ranks
    per_stage: dict[int, list[float]] = {}
    for st_index, c in comm.allgather((s, statistics.median(without_tp) / M)):
        per_stage.setdefault(st_index, []).append(c)
    calls = sum(n for _, n in every)
    slots = M + pp - 1
    # every rank ends the step together (the executor's closing barrier)
    step = comm.allreduce(statistics.median(steps_s), op=MPI.MAX)
    slowest = comm.allreduce(statistics.median(with_tp), op=MPI.MAX) / M
    # a wait is never below 0: a mean below it is the noise of two allreduces' times
    return {"micro_batches": M, "sync": max(0.0, sum(t for t, _ in every) / calls) if calls
            else 0.0,
            "slot": step / slots - slowest if pipe is not None else 0.0,
            "compute": comm.allreduce(statistics.median(without_tp), op=MPI.MAX) / M,
            "stages_compute": sum(statistics.median(v) for v in per_stage.values()),
            "step": step}


def driver_argv(w: planner.Workload, mesh: tuple[int, int, int, int], dataset: str,
                schedule: str, shard: int = 0, codec: str = "none") -> list[str]:
    """The SGD driver's arguments of ``mesh`` (``(dp, pp, tp, M)``; ZeRO stage ``shard``,
    gradient codec ``codec``, by default neither): the flags ``--run`` gives that
    configuration (:func:`.measure.driver_flags`)."""
    from .measure import driver_flags

    dp, pp, tp, M = mesh
    c = planner.Configuration(dp, pp, tp, M, shard, codec, schedule)
    return ["--hidden", ",".join(map(str, w.sizes[1:-1])), "--dataset", dataset,
            *driver_flags(c, w.global_batch // dp), "--epochs", "1", "--quiet"]


def driver_step(comm, w: planner.Workload, mesh: tuple[int, int, int, int],
                dataset: str = "digits", schedule: str = "1f1b", steps: int = STEPS,
                shard: int = 0, codec: str = "none") -> float:
    """Collective over ``comm`` (all of the launch): the slowest rank's median seconds of the
    SGD driver's own step (``Trainer.one_step``, as ``step_median_s`` of its summary counts
    it) on ``mesh`` (with ZeRO stage ``shard`` or the gradient codec ``codec``), over
    ``steps`` steps after a warm-up one."""
    from mpi4py import MPI

    from ..sgd import cli, datasets
    from ..sgd.driver import PipelinedTrainer, Trainer

    ds = datasets.load(dataset)
    cfg = cli.parse(driver_argv(w, mesh, dataset, schedule, shard, codec), comm.size,
                    len(ds.y_train))
    t = (PipelinedTrainer if cfg.mesh else Trainer)(cfg, ds, comm)
    try:
        order = None
        while t.step < steps + 1:
            if order is None or t.step % t.spe == 0:
                order = t.shard(t.step // t.spe)
            t.one_step(order)
    finally:
        t.close()
    return comm.allreduce(statistics.median(t.step_seconds[1:]), op=MPI.MAX)
