"""The planner's compute model: seconds of each Linear(+ReLU) layer's forward and backward.

A layer's local work is given by its shape on one rank: ``rows`` (the micro-batch), ``fan_in``
and ``fan_out`` (already divided by the tensor-parallel degree where the layer is split),
whether a ReLU follows (every layer but the last) and whether backward computes the gradient of
its input (every layer but the first). :class:`MeasuredCompute` times the NumPy operations the
SGD driver's :class:`~collectives.sgd.model.MLP` runs for that shape, on this machine:

- forward: ``z = h @ W + b``, then ``np.maximum(z, 0, out=z)``;
- backward: ``dz.sum(axis=0)`` (bias), ``h.T @ dz`` (weight), and where the input needs its
  gradient ``dz @ W.T`` and the ReLU mask ``*= h > 0``;
- the optimizer step per parameter: ``v = mu v + g; p -= lr v`` on a float32 buffer.

They run under ``threadpool_limits(threads)`` (the driver gives each rank ``cores // world``
BLAS threads, :func:`threads_per_rank`), and a rank's times are multiplied by ``slowdown``
(:func:`threads_per_rank`: more ranks than cores on a host share them). Each is run
:data:`REPETITIONS` times after one warm-up and the median kept (fewer repetitions for
shapes that take over :data:`BUDGET_S`); inside a launch (:mod:`collectives.plan.calibrate`)
each of those runs is a rate, the calls made back to back over a window of several
scheduler slices (:func:`median_time`). Results are cached in a JSON file (default
``plan-compute.json`` beside the tuning file, :func:`default_cache_path`) keyed by shape and
host name, so a shape is measured once per machine. Tests inject :class:`FlopRate` instead: a
closed form (seconds per multiply-add pair, and constant partner waits) their expected values
are computed from by hand. The partner waits (``sync``, ``handoff``) and the driver's
per-step residual (``driver``) come only from a
calibration inside the launch (:mod:`collectives.plan.partners`); a rank timed alone has no
partner.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from ...selection.tuning_file import default_path

__all__ = ["ComputeModel", "FlopRate", "MeasuredCompute", "default_cache_path", "driver_form",
           "REPETITIONS", "BUDGET_S", "FORMAT", "threads_per_rank", "measure_layer", "measure_update",
           "median_time"]

#: Timed repetitions per measurement (the median is kept).
REPETITIONS = 5
#: A shape whose first run takes longer than this is repeated only 3 times.
BUDGET_S = 0.2
#: The ``"format"`` of a compute cache file.
FORMAT = "collectives-plan-compute"


class ComputeModel(Protocol):
    """What the planner asks of a compute model."""

    def layer(self, rows: int, fan_in: int, fan_out: int, relu: bool,
              input_grad: bool) -> tuple[float, float]:
        """(forward, backward) seconds of one layer's local shape."""

    def update(self, params: int) -> float:
        """Seconds of the optimizer step over ``params`` parameters."""

    def overhead(self, mesh: tuple[int, int, int] | None = None) -> float:
        """Seconds per layer and micro-batch outside the layer kernels (Python, the loss) on
        ``mesh`` (``(dp, pp, tp)``; None: the data-parallel model's)."""

    def codec_speeds(self) -> dict[str, dict[str, float]]:
        """Codec speeds measured with the compute (a tuning file's ``"codecs"`` form), or {}."""

    def sync(self, dp: int, pp: int, tp: int) -> float:
        """Seconds a rank of this mesh waits per tp allreduce (dp-only: per gradient
        allreduce) for partners still computing, beyond the allreduce itself; 0 if unknown."""

    def handoff(self, dp: int, pp: int, tp: int) -> float:
        """Seconds per pipeline slot of this mesh beyond the stage's compute and modelled
        messages (the neighbor hand-offs; one stage: the step's closing wait); 0 if unknown."""

    def driver(self, dp: int, pp: int, tp: int, shard: int = 0, codec: str = "none",
               micro_batches: int | None = None) -> float:
        """Seconds per step of the driver's whole step on this mesh (with this ZeRO stage or
        gradient codec: :func:`driver_form`; with ``micro_batches`` per step) beyond what the
        other terms predict for it (the optimizer's and the batch's work, the driver's
        bookkeeping, what the data-parallel form costs beyond its formula; below 0 where
        they overprice it); 0 if unknown."""


@dataclass(frozen=True)
class FlopRate:
    """A closed-form compute model: ``seconds`` per floating-point operation of the matmuls
    (``2 rows fan_in fan_out`` forward; the same for the weight gradient and again for the
    input gradient in backward), ``update_s`` per parameter of the optimizer step,
    ``overhead_s`` per layer and micro-batch, and on every mesh ``sync_s`` per allreduce,
    ``handoff_s`` per pipeline slot and ``driver_s`` per step."""

    seconds: float
    update_s: float = 0.0
    overhead_s: float = 0.0
    sync_s: float = 0.0
    handoff_s: float = 0.0
    driver_s: float = 0.0
    #: per data-parallel form (:func:`driver_form`: "shard 2", a codec's spec), its own
    #: residual in place of ``driver_s`` (ZeRO 1, and 2-3 without their own: the dense one)
    forms: dict = field(default_factory=dict)

    def layer(self, rows: int, fan_in: int, fan_out: int, relu: bool,
              input_grad: bool) -> tuple[float, float]:
        flops = 2.0 * rows * fan_in * fan_out
        return flops * self.seconds, flops * (2 if input_grad else 1) * self.seconds

    def update(self, params: int) -> float:
        return params * self.update_s

    def overhead(self, mesh: tuple[int, int, int] | None = None) -> float:
        return self.overhead_s

    def codec_speeds(self) -> dict[str, dict[str, float]]:
        return {}

    def sync(self, dp: int, pp: int, tp: int) -> float:
        return self.sync_s

    def handoff(self, dp: int, pp: int, tp: int) -> float:
        return self.handoff_s

    def driver(self, dp: int, pp: int, tp: int, shard: int = 0, codec: str = "none",
               micro_batches: int | None = None) -> float:
        for form in _forms(shard, codec):
            if form in self.forms:
                return self.forms[form]
        return self.driver_s


def driver_form(shard: int, codec: str) -> str | None:
    """The name of a configuration's data-parallel form whose driver residual the calibration
    keeps apart: "shard N" for ZeRO stage 2 or 3, the codec's spec with a codec, None for the
    dense exchange (the mesh's own residual) and for ZeRO 1, whose exchange is the dense one's
    calls (ring allreduce's two halves, in place: ``collectives.parallel.zero``), so that its
    step is derived from the same lines with the update of a shard (docs/planner.md)."""
    if shard > 1:
        return f"shard {shard}"
    return None if shard or codec == "none" else codec


def _forms(shard: int, codec: str) -> list[str]:
    """The forms whose residual a configuration takes: its own, if it has one (else the
    mesh's dense residual)."""
    form = driver_form(shard, codec)
    return [] if form is None else [form]


def default_cache_path() -> Path:
    """``plan-compute.json`` beside the tuning file's default path."""
    return default_path().parent / "plan-compute.json"


def threads_per_rank(ranks_per_host: int, cores: int,
                     world: int | None = None) -> tuple[int, float]:
    """The BLAS threads of each rank (the SGD driver's ``max(1, cores // world)``: it divides a
    host's cores by the whole launch's ranks, ``world``, default ``ranks_per_host``) and the
    slowdown of their compute when the ``ranks_per_host`` ranks sharing ``cores`` cores have
    more threads than cores (``ranks x threads / cores``, at least 1)."""
    world = ranks_per_host if world is None else world
    if ranks_per_host < 1 or cores < 1 or world < ranks_per_host:
        raise ValueError(f"ranks per host and cores must be >= 1 and the launch's ranks at "
                         f"least those of a host, got {ranks_per_host}, {cores}, {world}")
    threads = max(1, cores // world)
    return threads, max(1.0, ranks_per_host * threads / cores)


def median_time(fn: Callable[[], object], repetitions: int = REPETITIONS,
                 window: float = 0.0) -> float:
    """Median seconds of one call of ``fn`` over ``repetitions`` timings. With ``window`` > 0
    each timing runs ``fn`` back to back for at least ``window`` seconds and divides by the
    calls: a rate, not one call. Ranks sharing a core (oversubscribed launches) need it: the
    scheduler hands each of them slices of a few milliseconds, so a single call shorter than
    a slice often runs at the speed of a rank alone while over a whole step each gets only its
    share of the core."""
    fn()  # warm-up (first touch of the buffers, BLAS threads)
    times = []
    for k in range(repetitions):
        calls = 0
        t0 = time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= window:
                break
        times.append(elapsed / calls)
        if k == 0 and elapsed >= BUDGET_S:
            repetitions = min(repetitions, 3)
        if k + 1 >= repetitions:
            break
    return statistics.median(times)


def measure_layer(rows: int, fan_in: int, fan_out: int, relu: bool, input_grad: bool,
                  repetitions: int = REPETITIONS, window: float = 0.0) -> tuple[float, float]:
    """Median (forward, backward) seconds of one layer's kernels (the module docstring), each
    timing a rate over ``window`` seconds where it is above 0 (:func:`median_time`)."""
    rng = np.random.default_rng(0)
    h = rng.standard_normal((rows, fan_in), dtype=np.float32)
    w = rng.standard_normal((fan_in, fan_out), dtype=np.float32)
    b = np.zeros(fan_out, np.float32)
    dz0 = rng.standard_normal((rows, fan_out), dtype=np.float32)
    gw = np.empty_like(w)
    gb = np.empty_like(b)

    def forward():
        z = h @ w + b
        if relu:
            np.maximum(z, 0, out=z)
        return z

    def backward():
        dz = dz0.copy() if relu else dz0
        dz.sum(axis=0, out=gb)
        np.matmul(h.T, dz, out=gw)
        if input_grad:
            dh = dz @ w.T
            dh *= h > 0
        return gw

    return (median_time(forward, repetitions, window),
            median_time(backward, repetitions, window))


def measure_update(n: int, repetitions: int = REPETITIONS, window: float = 0.0) -> float:
    """Median seconds per parameter of the momentum-SGD step over ``n`` parameters (a rate
    over ``window`` seconds where it is above 0)."""
    p = np.zeros(n, np.float32)
    g = np.ones(n, np.float32)
    v = np.zeros(n, np.float32)

    def step():
        v.__imul__(np.float32(0.9))
        v.__iadd__(g)
        p.__isub__(np.float32(0.01) * v)

    return median_time(step, repetitions, window) / n


@dataclass
class MeasuredCompute:
    """Layer times measured on this machine, cached in the JSON file ``path`` (None: not
    cached). ``measured`` counts the shapes measured by this object (the rest came from the
    cache).

    A file written by ``--calibrate`` inside a launch (it has ``"launch"``,
    :mod:`collectives.plan.calibrate`) is read as it is, whatever the host: its ``threads``, no
    slowdown, its per-layer ``overhead``, ``network`` its measured links and ``codecs`` its
    codecs' speeds; a shape it lacks
    is an error (it was calibrated for another workload), never measured alone here;
    ``partners`` its waits per mesh (``"dp,pp,tp"``: ``sync``, ``handoff``, ``driver``, and the
    stage's ``overhead`` where the mesh runs the driver's pipelined stage)."""

    path: Path | None = None
    threads: int = 1
    slowdown: float = 1.0
    measured: int = 0
    launch: dict | None = None
    network: dict = field(default_factory=dict)
    codecs: dict = field(default_factory=dict)
    partners: dict = field(default_factory=dict)
    _table: dict[str, list[float]] = field(default_factory=dict, repr=False)
    _host: str = field(default_factory=platform.node, repr=False)

    def __post_init__(self) -> None:
        if self.path is not None:
            self.path = Path(self.path)
            try:
                data = json.loads(self.path.read_text())
            except FileNotFoundError:
                data = None
            except (OSError, ValueError) as exc:
                raise ValueError(f"{self.path}: not a compute cache ({exc})") from None
            ok = isinstance(data, dict) and data.get("format") == FORMAT \
                and isinstance(data.get("times"), dict)
            if ok and isinstance(data.get("launch"), dict):
                self.launch = data["launch"]
                self.network = dict(data.get("network") or {})
                self.codecs = dict(data.get("codecs") or {})
                self.partners = dict(data.get("partners") or {})
                self.threads, self.slowdown = int(self.launch["threads"]), 1.0
                self._table = {k: list(v) for k, v in data["times"].items()}
            elif ok and data.get("host") == self._host:
                self._table = {k: list(v) for k, v in data["times"].items()}

    def _lookup(self, key: str, measure: Callable[[], list[float]]) -> list[float]:
        key = f"{key} threads={self.threads}"
        if key not in self._table and self.launch is not None:
            raise ValueError(f"{self.path}: calibrated inside a launch for another workload "
                             f"(no {key!r}): run --calibrate again with this --model, "
                             f"--batch-size and --micro-factors")
        if key not in self._table:
            from threadpoolctl import threadpool_limits

            with threadpool_limits(self.threads):
                self._table[key] = measure()
            self.measured += 1
            self._save()
        return [t * self.slowdown for t in self._table[key]]

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "host": self._host,
                                   "numpy": np.__version__, "times": self._table}, indent=0))
        tmp.replace(self.path)

    def layer(self, rows: int, fan_in: int, fan_out: int, relu: bool,
              input_grad: bool) -> tuple[float, float]:
        key = f"layer {rows} {fan_in} {fan_out} {int(relu)} {int(input_grad)}"
        fwd, bwd = self._lookup(key, lambda: list(measure_layer(rows, fan_in, fan_out, relu,
                                                                input_grad)))
        return fwd, bwd

    def update(self, params: int) -> float:
        (per_param,) = self._lookup("update", lambda: [measure_update(1 << 20)])
        return params * per_param

    def codec_speeds(self) -> dict[str, dict[str, float]]:
        """The launch's measured codec speeds ({} outside a calibrated launch)."""
        return self.codecs

    def _partner(self, dp: int, pp: int, tp: int, key: str) -> float:
        return float((self.partners.get(f"{dp},{pp},{tp}") or {}).get(key, 0.0))

    def sync(self, dp: int, pp: int, tp: int) -> float:
        """The launch's measured wait per allreduce of this mesh (``"partners"``); else 0."""
        return self._partner(dp, pp, tp, "sync")

    def handoff(self, dp: int, pp: int, tp: int) -> float:
        """The launch's measured hand-off per pipeline slot of this mesh; else 0."""
        return self._partner(dp, pp, tp, "handoff")

    def driver(self, dp: int, pp: int, tp: int, shard: int = 0, codec: str = "none",
               micro_batches: int | None = None) -> float:
        """The launch's measured driver residual per step of this mesh (the driver's whole
        step less the other terms' prediction of it, ``"partners"``): of this data-parallel
        form where the file has it (``"forms"``, :func:`driver_form`), else of the mesh's
        dense configuration; on a mesh whose residual was fitted as a line in the micro-batch
        count (``"driver_per_micro_batch"``), plus its slope times ``micro_batches`` less the
        probe's count; else 0."""
        entry = self.partners.get(f"{dp},{pp},{tp}") or {}
        forms = entry.get("forms") or {}
        s = next((float(forms[f]["driver"]) for f in _forms(shard, codec)
                  if "driver" in (forms.get(f) or {})), float(entry.get("driver", 0.0)))
        if micro_batches is not None and "driver_per_micro_batch" in entry:
            s += float(entry["driver_per_micro_batch"]) * (micro_batches
                                                           - int(entry["micro_batches"]))
        return s

    def overhead(self, mesh: tuple[int, int, int] | None = None) -> float:
        """The launch's measured per-layer overhead: of ``mesh``'s pipelined stage where the
        file has it (``"partners"``), else of the data-parallel ``MLP``; 0 outside a
        calibrated launch."""
        if self.launch is None:
            return 0.0
        per_mesh = (self.partners.get(",".join(map(str, mesh))) or {}) if mesh else {}
        if "overhead" in per_mesh:
            return float(per_mesh["overhead"])
        return self._lookup("overhead", lambda: [0.0])[0]
