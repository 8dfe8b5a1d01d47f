"""The predicted step time of a configuration: compute, pipeline bubble, communication per axis.

The survey's cost analysis (Ben-Nun & Hoefler, *Demystifying Parallel and Distributed Deep
Learning*, ACM CSUR 2019, section 6: data parallelism exchanges the whole gradient, model
parallelism the activations of split layers twice, pipelining the activations at stage
boundaries), made executable with the alpha-beta-gamma model of
:mod:`collectives.selection.cost_model` and a measured per-layer compute model. docs/planner.md
has the same formulas with an example.

Notation: ``G`` the global batch, ``M`` micro-batches, ``S = pp`` stages, ``r = G / (dp M)``
rows per micro-batch; ``F_l(r)``, ``B_l(r)`` the forward and backward seconds of layer ``l``'s
local shape (:mod:`.compute`); ``w_i`` the MLP's widths (``sizes``); ``A(n, p)`` the dp/tp
allreduce algorithm's cost (:data:`~collectives.selection.cost_model.COSTS`, ring by default) of
``n`` bytes on ``p`` ranks on that axis's network (:func:`.network.group_network`), ``AG(n, p)``
:func:`~collectives.selection.cost_model.allgather`; ``P2P(n)`` a neighbor message
(:func:`.network.p2p_seconds`); ``o`` the driver's seconds per layer and micro-batch outside
the kernels (measured in the launch, :mod:`collectives.plan.calibrate`, on the driver's
pipelined stage of this mesh where it runs one, else on its ``MLP``; 0 without it); ``w``
and ``h`` the mesh's partner waits measured in the launch by running the driver's own stage
(:mod:`collectives.plan.partners`; 0 without it): ``w`` per allreduce, the wait for partners
still computing that back-to-back allreduces never see, ``h`` per pipeline slot, what a slot
costs beyond its compute and the modelled messages. Per micro-batch, stage ``s`` costs::

    c_s = sum over its layers of F_l(r) + B_l(r) + o
    x_s = sum over its tensor-parallel pairs (i, i+1) of
              A(4 r w_{i+2}, tp) + w               forward: the row-parallel layer's output
            + A(4 r w_i, tp) + w   if i > 0        backward: the pair's input gradient
        + h                     if S = 1, tp > 1   the step's closing wait
    q_s = P2P(4 r w_out(s)) if s < S-1             its activation to the next stage
        + P2P(4 r w_in(s))  if s > 0               its input's gradient to the previous one
        + h                 if S > 1               the hand-offs of one slot
    t_s = c_s + x_s + q_s

The stages are cut to balance ``c_s + x_s`` (:func:`partition`); the slowest, ``s*``, sets the pace:
the pipeline (GPipe or 1F1B, which have the same bubble) takes ``(M + S - 1) t_{s*}``, of which
``(S - 1) t_{s*}`` is the bubble, ``(S-1)/(M+S-1)`` of it. Then each stage exchanges the
gradient of its ``Psi_s`` local parameters over dp (``n = 4 Psi_s`` bytes) and steps::

    dp_s = A(n, dp) (+ w on a dp-only mesh)           dense (shard 0); every form below
                                                      gets the same + w on a dp-only mesh
         = ring(n, dp)                                ZeRO 1-2: reduce-scatter + allgather
         = z ring(n, dp)                              ZeRO 3: again, z <= 1.5 (zero3_factor)
         = A(b, dp) + (e + d) n                       summable codec (fp16, bf16), b its payload
         = AG(b, dp) + (e + d) n + q dp b             other codecs (top-k): allgather strategy
    u_s  = update(Psi_s / dp if shard >= 1 else Psi_s)

with ``e, d, q`` the codec's encode, decode and per-payload-byte seconds (measured inside the
launch by ``--calibrate``, else the tuning file's ``"codecs"`` section, else
:data:`collectives.compressed.auto.DEFAULT_SPEEDS`), as ``codec="auto:..."`` prices them. The step::

    step    = (M + S - 1) t_{s*} + max_s (dp_s + u_s) + s
    compute = M c_{s*} + u_{s'}       bubble = (S - 1) t_{s*}      (s' the max's stage)
    tp      = M x_{s*}                pp     = M q_{s*}           dp = dp_{s'}

with ``s`` the mesh's driver residual per step (``ComputeModel.driver``; 0 without a
calibration): the driver's whole step measured in the launch on that mesh (the probe's
micro-batch count) less the rest of this formula for the same configuration,
:mod:`collectives.plan.calibrate`: the optimizer's and the batch's work and the driver's
bookkeeping that the kernels, ``o`` and the waits do not hold; it may be below 0 where the other
terms overprice the mesh. On a pipeline mesh the driver is timed at each of its micro-batch
counts and ``s`` is the least-squares line through those residuals,
``s(M) = s(M_probe) + s_M (M - M_probe)``: per micro-batch the driver does work the stage
probe's ``o`` and ``h`` hold only in part. On a mesh with dp > 1 it is measured per
data-parallel form (:func:`~.compute.driver_form`): dense, ZeRO 2 and 3 where the driver takes
them (dp-only meshes) and each calibrated codec have their own ``s``, the driver timed with that
form, so what the form's exchange costs beyond its ``dp_s`` line (the buckets, the layers'
gathers, the passes over the vector the cost model does not see) is in it; ZeRO 1, whose
exchange is the dense one's calls (ring allreduce's two halves in place), and a form the
calibration did not time take the dense one. So ``step = compute + bubble + dp + pp + tp + s``.
Memory per rank (the largest stage; float32): parameters ``4 Psi`` (``/dp`` at ZeRO 3),
gradients ``4 Psi`` (``/dp`` at 2-3), optimizer state (the momentum, plus error feedback's
residual for codecs that need one) ``4 Psi`` each (``/dp`` at 1-3), activations
``4 r (w_in(s) + sum of its layers' local outputs)`` per micro-batch in flight: ``M`` for GPipe,
``min(M, S - s)`` for 1F1B.

Not modelled: communication overlapped with compute (everything above is serial), stragglers
and noise, memory limits. Ranks sharing cores are in the measured ``F``, ``B`` when the compute
model was calibrated inside the launch; otherwise a slowdown factor stands for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ...compressed.auto import DEFAULT_SPEEDS, CodecSpeed
from ...selection.cost_model import COSTS, Network, allgather, predict as cost
from ...selection.tuning_file import read_codec_speeds
from ..prefetch import BACKWARD, keep_for, schedule
from .compute import ComputeModel
from .config import Configuration, Layer, Workload, check, codec_of
from .network import Cluster, axis_groups, group_network, mesh_rank, p2p_seconds

__all__ = ["Prediction", "Memory", "predict", "partition", "codec_speed", "zero3_factor"]


def zero3_factor(sizes: Sequence[int]) -> float:
    """The bytes ZeRO stage 3 moves over those of an allreduce of layers of ``sizes``
    parameters: a reduce-scatter (half an allreduce), every layer's forward gather and the
    backward gathers of :func:`..prefetch.schedule` (the layers :func:`..prefetch.keep_for`
    keeps need none). 1.5 when every layer is gathered twice (Rajbhandari et al. 2020)."""
    total = sum(sizes)
    if total == 0:
        return 1.0
    again = sum(sizes[i] for i, phase in schedule(len(sizes), keep_for(sizes))
                if phase == BACKWARD)
    return 1.0 + again / (2.0 * total)


@dataclass(frozen=True)
class Memory:
    """Bytes per rank of the largest stage."""

    params: float
    grads: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations


@dataclass(frozen=True)
class Prediction:
    """Seconds of one step of ``config`` and their parts (the module docstring)."""

    config: Configuration
    compute: float
    bubble: float
    dp: float
    pp: float
    tp: float
    memory: Memory
    stages: tuple[tuple[int, ...], ...]   # the layers of each stage
    driver: float = 0.0                   # s: the mesh's measured driver residual per step

    @property
    def step(self) -> float:
        return self.compute + self.bubble + self.dp + self.pp + self.tp + self.driver


def codec_speed(spec: str, tuning: str | Path | None = None,
                measured: dict | None = None) -> CodecSpeed:
    """The codec's per-byte speeds: ``measured`` (inside the launch, ``--calibrate``) or the
    tuning file's entry of this spec, else of this codec name, else the built-in
    :data:`DEFAULT_SPEEDS`."""
    name = spec.partition(":")[0]
    table = {**(read_codec_speeds(tuning) if tuning is not None else {}), **(measured or {})}
    for key in (spec, *[k for k in table if k.partition(":")[0] == name]):
        if key in table:
            return CodecSpeed(**table[key], source=f"measured ({key})")
    return DEFAULT_SPEEDS.get(name, DEFAULT_SPEEDS["*"])


def partition(weights: Sequence[float], parts: int) -> list[list[int]]:
    """Consecutive groups of ``range(len(weights))``, ``parts`` of them, none empty, whose
    largest sum is the smallest possible (the linear-partition dynamic programme)."""
    n = len(weights)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} blocks into {parts} stages")
    prefix = [0.0]
    for x in weights:
        prefix.append(prefix[-1] + x)
    # best[k][j]: the smallest largest sum cutting the first j blocks into k groups
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                v = max(best[k - 1][i], prefix[j] - prefix[i])
                if v < best[k][j]:
                    best[k][j], cut[k][j] = v, i
    groups, j = [], n
    for k in range(parts, 0, -1):
        i = cut[k][j]
        groups.append(list(range(i, j)))
        j = i
    return groups[::-1]


def _sizes(layers: Sequence[Layer]) -> list[int]:
    return [l.fan_in * l.fan_out + l.fan_out for l in layers]


def _params(layers: Sequence[Layer]) -> int:
    return sum(_sizes(layers))


def _sharded(nbytes: float, c: Configuration, stage: int) -> float:
    """``nbytes`` per rank, divided over dp from ZeRO stage ``stage`` on."""
    return nbytes / c.dp if c.shard >= stage else nbytes


def _tp_seconds(block: Sequence[Layer], w: Workload, rows: int, tp: int, net: Network,
                algorithm: str, sync: float) -> float:
    if tp == 1 or len(block) < 2:
        return 0.0
    i = block[0].index
    t = cost(algorithm, 4.0 * rows * w.sizes[i + 2], tp, net) + sync
    if i > 0:
        t += cost(algorithm, 4.0 * rows * w.sizes[i], tp, net) + sync
    return t


def predict(c: Configuration, w: Workload, cl: Cluster, compute: ComputeModel,
            algorithm: str = "ring", tuning: str | Path | None = None) -> Prediction:
    """The :class:`Prediction` of ``c`` (valid for ``w`` on ``cl``, else ValueError)."""
    check(c, w, cl.ranks)
    if algorithm not in COSTS:
        raise ValueError(f"no cost model for {algorithm!r}; valid choices: {', '.join(COSTS)}")
    S, M = c.pp, c.micro_batches
    rows = w.global_batch // (c.dp * M)
    tp_net = group_network(cl, axis_groups("tp", c.dp, c.pp, c.tp))
    dp_net = group_network(cl, axis_groups("dp", c.dp, c.pp, c.tp))

    blocks = w.blocks(c.tp)
    o = compute.overhead((c.dp, c.pp, c.tp))
    comp = [sum(sum(compute.layer(rows, l.fan_in, l.fan_out, l.relu, l.input_grad)) + o
                for l in b) for b in blocks]
    sync = compute.sync(c.dp, c.pp, c.tp)
    tpx = [_tp_seconds(b, w, rows, c.tp, tp_net, algorithm, sync) for b in blocks]
    groups = partition([a + b for a, b in zip(comp, tpx)], S)

    def boundary(s: int) -> float:  # stage s sends its output to stage s+1, all (d, t) at once
        width = w.sizes[blocks[groups[s][-1]][-1].index + 1]
        pairs = [(mesh_rank(d, s, t, c.pp, c.tp), mesh_rank(d, s + 1, t, c.pp, c.tp))
                 for d in range(c.dp) for t in range(c.tp)]
        return p2p_seconds(cl, pairs, 4.0 * rows * width)

    # the hand-off per slot: with a pipeline the neighbor messages', else the step's closing
    # wait of a tp mesh (the executor's barrier)
    h = compute.handoff(c.dp, c.pp, c.tp) if S > 1 or c.tp > 1 else 0.0
    per = []
    for s, g in enumerate(groups):
        cs, xs = sum(comp[j] for j in g), sum(tpx[j] for j in g)
        qs = (boundary(s) if s < S - 1 else 0.0) + (boundary(s - 1) if s > 0 else 0.0)
        if S > 1:
            qs += h
        else:
            xs += h
        per.append((cs + xs + qs, cs, xs, qs))
    t_star, c_star, x_star, q_star = max(per, key=lambda v: v[0])

    codec = codec_of(c.codec)
    speed = codec_speed(c.codec, tuning, compute.codec_speeds()) if codec is not None else None
    # data parallelism alone: the gradient's exchange waits for the replicas' backward (with
    # pp or tp the pipeline's closing barrier has lined the ranks up, its wait is in h)
    dp_sync = sync if c.dp > 1 and S == 1 and c.tp == 1 else 0.0
    tails, memories = [], []
    for s, g in enumerate(groups):
        layers = [l for j in g for l in blocks[j]]
        psi = _params(layers)
        n = 4.0 * psi
        if c.dp == 1:
            dps = 0.0
        elif codec is None:
            dps = cost(algorithm if c.shard == 0 else "ring", n, c.dp, dp_net)
            dps *= zero3_factor(_sizes(layers)) if c.shard == 3 else 1.0
            dps += dp_sync
        else:
            b = float(codec.payload_nbytes((psi,), np.float32))
            coding = (speed.encode + speed.decode) * n
            if codec.summable:
                dps = cost(algorithm, b, c.dp, dp_net) + coding + dp_sync
            else:
                dps = allgather(b, c.dp, dp_net) + coding + speed.payload * c.dp * b + dp_sync
        us = compute.update(psi // c.dp if c.shard >= 1 else psi)
        tails.append((dps + us, dps, us))
        residual = 4.0 * psi if codec is not None and codec.needs_error_feedback else 0.0
        in_flight = M if c.schedule == "gpipe" else min(M, S - s)
        acts = 4.0 * rows * (layers[0].fan_in + sum(l.fan_out for l in layers)) * in_flight
        memories.append(Memory(_sharded(n, c, 3), _sharded(n, c, 2),
                               _sharded(n, c, 1) + residual, acts))
    _, dp_tail, u_tail = max(tails, key=lambda v: v[0])
    memory = max(memories, key=lambda m: m.total)
    stages = tuple(tuple(l.index for j in g for l in blocks[j]) for g in groups)
    return Prediction(c, M * c_star + u_tail, (S - 1) * t_star, dp_tail, M * q_star,
                      M * x_star, memory, stages,
                      compute.driver(c.dp, c.pp, c.tp, c.shard, c.codec, M))
