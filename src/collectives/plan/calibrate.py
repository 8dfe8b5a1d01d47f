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
  the median of its :data:`REPETITIONS` runs, each the calls made back to back in
  :data:`WINDOW_S` seconds (a rate: a single call shorter than the scheduler's slice runs at
  the speed of a rank alone, which no rank sharing a core has over a step), and the file
  keeps the median over the ranks;
- **network**: the library's ring allreduce (the driver's dp and tp axes) timed at the sizes of
  :data:`PROBE_SIZES`, first on each host's ranks (every host at once), then on all ranks;
  ``alpha``, ``beta`` and then ``alpha_inter``, ``beta_inter`` are the values for which the cost
  model's ring formula comes closest to those times (the slowest rank's median; least squares
  of the relative errors). Every rank takes part, so
  a step's latency includes waiting for a peer that shares a core with others;
- **codecs**: each ``--codecs`` codec's pipeline speed
  (:func:`collectives.compressed.speed.measure_speed`, the slowest rank's), as the tuning file's
  ``"codecs"`` section holds it;
- **partner waits** (:mod:`.partners`): the driver's own stage run on every mesh, each tp
  allreduce followed by a second: the wait ``w`` per allreduce for partners still computing,
  and ``h`` per pipeline slot beyond the compute and the messages the cost model prices
  (:func:`handoffs`);
- **driver residual** ``s`` (:func:`residuals`): the SGD driver's whole step timed on every
  mesh (:func:`.partners.driver_step`: its own trainer, the optimizer step and the batch
  included) less what the planner predicts for the same configuration from everything
  above (the median of :data:`DRIVER_ROUNDS` rounds over all the meshes and forms); the term
  the kernels, the overheads and the waits do not hold, per step; on a pipeline mesh timed
  at each of its micro-batch counts and fitted as a line in the count; on a mesh
  with dp > 1 also with each ``--codecs`` codec and, on a dp-only mesh, ZeRO 2 and 3, each
  its own ``s`` (``"forms"``: what the form's exchange costs beyond its formula is in it;
  ZeRO 1, the dense exchange's calls, takes the dense ``s``);
- **overhead**: the driver's per-micro-batch work outside the matmuls, timed on the driver's own
  :class:`~collectives.sgd.model.MLP`: its forward and backward of a micro-batch minus the sum of
  the layer kernels of the same shapes (Python calls, the loss and softmax, temporaries), per
  layer and per micro-batch at the rows of the data-parallel configuration.

Rank 0 writes a compute cache (:class:`~collectives.parallel.planner.MeasuredCompute`'s format)
tagged with the launch: ``"launch"`` (ranks, hosts, threads), ``"network"`` and
``"partners"``. The planner then reads it with ``--compute-cache FILE`` and uses its times as
they are (no slowdown factor) and its network parameters over the defaults and ``--network``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from ..parallel import planner
from ..parallel.planner.compute import FORMAT, median_time, measure_layer, measure_update

__all__ = ["shapes", "run", "handoffs", "residuals", "REPETITIONS", "WINDOW_S", "DRIVER_ROUNDS",
           "PROBE_SIZES"]

#: Timed runs per shape on each rank (the median is kept).
REPETITIONS = 7
#: Seconds each timed run lasts, calls back to back (a rate): several of the scheduler's
#: slices, so that ranks sharing a core are timed at their share of it, as in the driver's
#: step, and not at the speed of a call that fit in one slice.
WINDOW_S = 0.025
#: Rounds over every mesh of the driver's timed steps (the median of the rounds is kept).
DRIVER_ROUNDS = 2
#: The allreduce sizes the links are fitted to (bytes per rank).
PROBE_SIZES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)
#: The float32 elements each codec's speed is measured on.
CODEC_ELEMENTS = 1 << 22
_PINGS = 11
_FIT_STEPS = 30


def shapes(w: planner.Workload, ranks: int, micro_factors, schedule: str) -> list[tuple]:
    """Every (rows, fan_in, fan_out, relu, input_grad) some valid configuration needs."""
    out = set()
    for c in planner.configurations(w, ranks, ("none",), micro_factors, schedule):
        rows = w.global_batch // (c.dp * c.micro_batches)
        for block in w.blocks(c.tp):
            for l in block:
                out.add((rows, l.fan_in, l.fan_out, l.relu, l.input_grad))
    return sorted(out)


def _allreduce_seconds(comm, nbytes: int) -> float:
    """The slowest rank's median seconds of the library's ring allreduce of ``nbytes`` on
    ``comm`` (the one the driver's dp and tp axes run), every rank of COMM_WORLD at once."""
    from mpi4py import MPI

    from ..api import allreduce

    x = np.ones(max(1, nbytes // 4), np.float32)
    allreduce(x, out=x, algorithm="ring", comm=comm)
    times = []
    for _ in range(_PINGS):
        comm.Barrier()
        t0 = time.perf_counter()
        allreduce(x, out=x, algorithm="ring", comm=comm)
        times.append(time.perf_counter() - t0)
    return comm.allreduce(statistics.median(times), op=MPI.MAX)


def _fit(measured: dict[int, float], p: int, net,
         keys: tuple[str, str]) -> tuple[float | None, float | None]:
    """The (alpha, beta) named ``keys`` of ``net`` for which the cost model's ring allreduce on
    ``p`` ranks comes closest to the ``measured`` seconds at every size, relative to each time
    (least squares by Gauss-Newton steps: the model is linear in them but for its segment
    pipelining), neither below 0."""
    from dataclasses import replace

    from ..selection.cost_model import predict as cost

    def f(a, b, n):
        return cost("ring", float(n), p, replace(net, **{keys[0]: a, keys[1]: b}))

    alpha, beta = 1e-4, 1e-9   # Gauss-Newton from a start of the size fitted values take
    sizes = sorted(measured)
    t = np.array([measured[n] for n in sizes])
    for _ in range(_FIT_STEPS):
        da, db = max(alpha, 1e-6) * 1e-3, max(beta, 1e-12) * 1e-3
        base = np.array([f(alpha, beta, n) for n in sizes])
        jac = np.array([[(f(alpha + da, beta, n) - b0) / da, (f(alpha, beta + db, n) - b0) / db]
                        for n, b0 in zip(sizes, base)]) / t[:, None]
        (ua, ub), *_ = np.linalg.lstsq(jac, (t - base) / t, rcond=None)
        alpha, beta = max(0.0, alpha + ua), max(0.0, beta + ub)
    # a parameter the times do not depend on (a ring whose every step is paced by the other
    # level) is not measured: None, and the planner keeps its default
    seen = np.abs(jac).max(axis=0) * np.array([max(alpha, 1e-6), max(beta, 1e-12)])
    return tuple(float(v) if s > 1e-3 else None for v, s in zip((alpha, beta), seen))


def _links(comm, cl: planner.Cluster, probes: dict) -> dict[str, float]:
    """``alpha``/``beta`` (one host's ranks, every host at once) and ``alpha_inter``/
    ``beta_inter`` (all ranks) fitted to the ring allreduce measured at :data:`PROBE_SIZES`
    (the times go into ``probes``: "host" and "all", bytes -> seconds)."""
    from dataclasses import replace

    from mpi4py import MPI

    from ..parallel.planner.network import group_network

    out: dict[str, float] = {}
    net = cl.net
    if cl.per_host > 1:
        host = comm.Split(comm.rank // cl.per_host, comm.rank)
        t = {n: _allreduce_seconds(host, n) for n in PROBE_SIZES}
        t = {n: comm.allreduce(v, op=MPI.MAX) for n, v in t.items()}
        host.Free()
        probes["host"] = t
        out["alpha"], out["beta"] = _fit(t, cl.per_host, net.intra(), ("alpha", "beta"))
        net = replace(net, **{k: out[k] for k in ("alpha", "beta") if out[k] is not None})
    if cl.hosts > 1:
        t = {n: _allreduce_seconds(comm, n) for n in PROBE_SIZES}
        probes["all"] = t
        g = group_network(replace(cl, net=net), [list(range(cl.ranks))])
        out["alpha_inter"], out["beta_inter"] = _fit(t, cl.ranks, g,
                                                     ("alpha_inter", "beta_inter"))
    return {k: v for k, v in out.items() if v is not None}


def _overhead(w: planner.Workload, rows: int, threads: int) -> float:
    """Seconds per layer and micro-batch of the driver's MLP beyond its layer kernels."""
    from ..sgd.model import MLP

    model = MLP(list(w.sizes), seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, w.sizes[0]), dtype=np.float32)
    y = rng.integers(0, w.sizes[-1], rows)

    def step():
        model.loss_and_grad(x, y)

    whole = median_time(step, REPETITIONS, WINDOW_S)
    kernels = 0.0
    for i in range(w.layers):
        f, b = measure_layer(rows, w.sizes[i], w.sizes[i + 1], i < w.layers - 1, i > 0,
                             REPETITIONS, WINDOW_S)
        kernels += f + b
    return max(0.0, whole - kernels) / w.layers


def _codec_speeds(comm, codecs, count: int) -> dict[str, dict[str, float]]:
    """Each codec's pipeline speed (:func:`collectives.compressed.speed.measure_speed`) on
    every rank at once, the slowest rank's, as ``collectives-tune`` keeps them."""
    from mpi4py import MPI

    from ..compressed.speed import measure_speed

    out = {}
    for spec in codecs:
        if spec == "none":
            continue
        comm.Barrier()
        sp = measure_speed(spec, count, comm.size, REPETITIONS)
        out[spec] = {k: comm.allreduce(getattr(sp, k), op=MPI.MAX)
                     for k in ("encode", "decode", "payload")}
    return out


def handoffs(path: Path, w: planner.Workload, cl: planner.Cluster, found: dict,
             schedule: str) -> dict:
    """``found`` (:func:`.partners.probe` per mesh) with each mesh's hand-off ``h``: its
    measured seconds per slot beyond the slowest rank's compute, less the neighbor messages
    the cost model prices for that slot (read from the calibration file ``path``, its links
    over ``cl``'s), at least 0; no pipeline and no tp: 0. With a pipeline or tp also its
    stage ``overhead`` per layer and micro-batch: the stages' compute less the kernels the
    file has for the same shapes, over the layers, at least 0."""
    from dataclasses import replace

    compute = planner.MeasuredCompute(path)
    measured = replace(cl, net=replace(cl.net, **{k: float(v)
                                                  for k, v in compute.network.items()}))
    out = {}
    for key, v in found.items():
        dp, pp, tp = (int(x) for x in key.split(","))
        M = int(v["micro_batches"])
        messages = 0.0
        if pp > 1:
            c = planner.Configuration(dp, pp, tp, M, 0, "none", schedule)
            messages = planner.predict(c, w, measured, compute).pp / c.micro_batches
        out[key] = {**v, "messages": messages,
                    "handoff": max(0.0, v["slot"] - messages) if pp > 1 or tp > 1 else 0.0}
        if pp > 1 or tp > 1:  # the driver's pipelined stage (dp alone runs its MLP: o)
            rows = w.global_batch // (dp * M)
            kernels = sum(sum(compute.layer(rows, l.fan_in, l.fan_out, l.relu, l.input_grad))
                          for b in w.blocks(tp) for l in b)
            out[key]["overhead"] = max(0.0, v["stages_compute"] - kernels) / w.layers
    return out


def residuals(path: Path, w: planner.Workload, cl: planner.Cluster, schedule: str) -> dict:
    """The calibration file ``path``'s ``"partners"`` with each mesh's driver residual
    ``driver`` (``s``, seconds per step): its measured ``driver_step`` less the planner's
    prediction (from the file as it is, its links over ``cl``'s, ``s`` not yet in it) of the
    configuration the driver ran there (the mesh, its ``micro_batches``, no ZeRO, no codec),
    and that prediction as ``predicted``; the same for each data-parallel form the driver was
    timed with on that mesh (``"forms"``: its configuration with that ZeRO stage or codec).
    Not bounded below: where the other terms overprice the mesh it is negative. A pipeline
    mesh timed at other micro-batch counts too (``"counts"``) gets each count's residual, and
    ``driver`` and ``driver_per_micro_batch`` are the least-squares line through them all:
    ``s(M) = driver + driver_per_micro_batch (M - micro_batches)``; its forms' residuals,
    measured at the probe's count, move with the same slope."""
    from dataclasses import replace

    compute = planner.MeasuredCompute(path)
    measured = replace(cl, net=replace(cl.net, **{k: float(v)
                                                  for k, v in compute.network.items()}))
    def residual(c: planner.Configuration, step: float) -> dict[str, float]:
        p = planner.predict(c, w, measured, compute)  # the file has no s yet: p.driver is 0
        return {"predicted": p.step - p.driver, "driver": float(step) - (p.step - p.driver)}

    out = {}
    for key, v in compute.partners.items():
        out[key] = dict(v)
        if "driver_step" not in v:
            continue
        dp, pp, tp = (int(x) for x in key.split(","))
        M = int(v["micro_batches"])
        out[key].update(residual(planner.Configuration(dp, pp, tp, M, 0, "none", schedule),
                                 v["driver_step"]))
        if v.get("counts"):  # a pipeline mesh: each count's residual, and the line through all
            counts = {n: {**u, **residual(planner.Configuration(dp, pp, tp, int(n), 0, "none",
                                                                 schedule), u["driver_step"])}
                      for n, u in v["counts"].items()}
            out[key]["counts"] = counts
            points = [(M, out[key]["driver"]), *((int(n), u["driver"])
                                                 for n, u in counts.items())]
            slope, at_zero = np.polyfit(*zip(*points), 1)
            out[key]["driver_per_micro_batch"] = float(slope)
            out[key]["driver"] = float(at_zero + slope * M)
        forms = {form: {**f, **residual(planner.Configuration(dp, pp, tp, M, int(f["shard"]),
                                                              f["codec"], schedule),
                                        f["driver_step"])}
                 for form, f in (v.get("forms") or {}).items()}
        if forms:
            out[key]["forms"] = forms
    return out


def run(path: Path, w: planner.Workload, cl: planner.Cluster, micro_factors, schedule: str,
        out, codecs=(), dataset: str = "digits") -> int:
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
            mine = measure_layer(rows, fan_in, fan_out, relu, grad, REPETITIONS, WINDOW_S)
            every = comm.gather(mine, root=0)
            if comm.rank == 0:
                key = f"layer {rows} {fan_in} {fan_out} {int(relu)} {int(grad)} threads={threads}"
                times[key] = [statistics.median(t[0] for t in every),
                              statistics.median(t[1] for t in every)]
        comm.Barrier()
        update = comm.gather(measure_update(1 << 20, REPETITIONS, WINDOW_S), root=0)
        comm.Barrier()
        over = comm.gather(_overhead(w, w.global_batch // cl.ranks, threads), root=0)
    with threadpool_limits(threads):
        speeds = _codec_speeds(comm, codecs, CODEC_ELEMENTS)
    probes: dict = {}
    net = _links(comm, cl, probes)
    from . import partners as _partners

    found = {}
    meshes = _partners.meshes(w, cl.ranks, micro_factors, schedule)
    with threadpool_limits(threads):
        for mesh in meshes:
            comm.Barrier()
            found[",".join(map(str, mesh[:3]))] = _partners.probe(comm, w, mesh)
        # the driver's step on every mesh and form, in DRIVER_ROUNDS rounds over all of them:
        # a slow spell of the machine then falls on every mesh's median alike, not on one
        # (a pipeline mesh's dense step also at its other micro-batch counts)
        others = _partners.other_counts(w, cl.ranks, micro_factors, schedule)
        steps: dict[tuple[str, int, tuple | None], list[float]] = {}
        for _ in range(DRIVER_ROUNDS):
            for mesh in meshes:
                key = ",".join(map(str, mesh[:3]))
                runs = [(mesh[3], shard, codec) for shard, codec in
                        ((0, "none"), *_partners.driver_forms(mesh, codecs))]
                runs += [(M, 0, "none") for M in others.get(mesh[:3], ())]
                for M, shard, codec in runs:
                    form = None if (shard, codec) == (0, "none") else (shard, codec)
                    comm.Barrier()
                    steps.setdefault((key, M, form), []).append(_partners.driver_step(
                        comm, w, (*mesh[:3], M), dataset, schedule, shard=shard, codec=codec))
        for (key, M, form), t in steps.items():
            if M != found[key]["micro_batches"]:
                found[key].setdefault("counts", {})[str(M)] = {
                    "micro_batches": M, "driver_step": statistics.median(t)}
            elif form is None:
                found[key]["driver_step"] = statistics.median(t)
            else:
                found[key].setdefault("forms", {})[planner.driver_form(*form)] = {
                    "shard": form[0], "codec": form[1], "driver_step": statistics.median(t)}
    if comm.rank == 0:
        times[f"update threads={threads}"] = [statistics.median(update)]
        times[f"overhead threads={threads}"] = [statistics.median(over)]
        launch = {"ranks": comm.size, "hosts": hosts, "threads": threads,
                  "seconds": round(time.perf_counter() - t_start, 1)}
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": FORMAT, "host": platform.node(), "numpy": np.__version__,
                "launch": launch, "network": net, "probes": probes, "codecs": speeds,
                "times": times, "partners": found}
        path.write_text(json.dumps(data, indent=0))
        data["partners"] = handoffs(path, w, cl, found, schedule)
        path.write_text(json.dumps(data, indent=0))
        data["partners"] = residuals(path, w, cl, schedule)
        path.write_text(json.dumps(data, indent=0))
        print(f"calibrated {len(todo)} layer shapes on {comm.size} ranks at once "
              f"({threads} BLAS thread(s) each, {launch['seconds']} s); network "
              + ", ".join(f"{k} {v * (1e6 if k.startswith('alpha') else 1e9):.3f} "
                          f"{'us' if k.startswith('alpha') else 'ns/B'}" for k, v in net.items())
              + f"; overhead {times[f'overhead threads={threads}'][0] * 1e6:.0f} us per layer and "
              f"micro-batch; per mesh (dp,pp,tp: sync w per allreduce, hand-off h per slot, "
              f"driver residual s per step) "
              + ", ".join(f"{k}: {v['sync'] * 1e3:.2f}/{v['handoff'] * 1e3:.2f}/"
                          f"{v.get('driver', 0.0) * 1e3:.1f} ms"
                          + "".join(f" ({f}: s {g['driver'] * 1e3:.1f} ms)"
                                    for f, g in (v.get("forms") or {}).items())
                          for k, v in data["partners"].items())
              + f"; wrote {path}", file=out)
    return 0
