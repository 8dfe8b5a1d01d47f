"""``--shard 1|2|3``: sharded data parallelism (ZeRO's stages) as the driver's exchange.

The stages and their exchanges are :mod:`collectives.parallel.zero`'s; this mode fits them to
the MLP and the training loop's hooks (:mod:`.base`):

- the model keeps only what the stage keeps (:meth:`Sharded.holds`): stage 1 the full parameters
  and gradient, stage 2 the full parameters, stage 3 neither (its shard of the parameters is
  initialised layer by layer from the same generator as the whole model's,
  ``model.initial_layers``, so every stage starts from data parallelism's bits);
- the optimizer runs on :attr:`Sharded.update_params` and :attr:`Sharded.update_grads`, the
  owned shards, with the same learning-rate schedule; at stages 2-3 (:data:`PER_BUCKET`) it
  updates each bucket's slices of the shard as their average lands, so no averaged shard is
  held;
- stage 1 reduce-scatters the whole gradient after backward (``__call__``) in one call, in
  place, each rank's average landing in its own slice (``Zero.reduce_all``: with the allgather
  after the update, ring allreduce's two halves); stages 2 and 3 hand
  the model a :class:`~collectives.sgd.model.LayerSource` (:meth:`Sharded.backward_hooks`)
  whose gradient blocks are buckets of at most ``--bucket-mb`` and, with the block each lands
  in, at most 1/:data:`BUCKET_SHARE` of a shard (but :data:`MIN_BUCKET` elements at least), consecutive
  rows of a layer (with :data:`BALANCED` a block of rows of every owner's part of it), each
  reduce-scattered as backward finishes it and freed (at the stages of :data:`PIPELINED` on the progress
  engine while backward computes the next bucket: two buckets alive, each half as large);
  stage 3's source also gathers each layer's parameters before forward and backward
  (:class:`collectives.parallel.LayerGather`, one ahead on the progress engine);
- stages 1 and 2 allgather the updated parameters after the update (``average_params``);
- with ``--param-codec`` the parameters' allgathers are ``collectives.compressed_allgather``
  (stage 3: each layer's gathers; stages 1-2: the allgather after the update): every rank
  computes with the same decoded parameters, while owners keep full-precision masters (stage 3:
  the shard; stages 1-2: a master slice beside the replica, which the optimizer updates and
  checkpoints save);
- with ``--codec`` every bucket's reduce-scatter is ``collectives.compressed_reduce_scatter``:
  each destination block compressed on its own, error feedback (where the codec takes it)
  keeping one residual per bucket and destination block, so the residual memory is the
  gradient's size per rank, in float32 or, with ``--residual-dtype``, in float16 or bfloat16
  (docs/sharded.md).

Communication inside backward (stages 2-3) is counted as communication, not compute: the
mode moves its seconds from the clock's "compute" to the exchange's statistics. Every array
the mode makes is tracked in :attr:`Sharded.ledger` (peak memory per category).

Checkpoints are sharded (``collectives.sgd.checkpoint``): each rank writes its owned slice of the
parameters (the master, with ``--param-codec``) and of the momentum; ``--save-params`` gathers
the full parameters on rank 0 (the masters, with ``--param-codec``).
"""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple, Sequence

import numpy as np
from mpi4py import MPI

from ...compressed import CompressionState
from ...compressed.shard import compressed_reduce_scatter
from ...compressed.strategies import why_not_gather, why_not_rounding
from ...engine.nonblocking import icompressed_reduce_scatter
from ...parallel import (ALGORITHMS, BACKWARD, FORWARD, STAGES, LayerGather, ShardPlan, Zero,
                         keep_for)
from ..._runtime.traffic import TRAFFIC
from ..fusion import FusionBuffer
from ..model import initial_layers
from ..timing import Clock
from .base import GOSSIP_DTYPE, Refusal, SyncMode, ring_bytes

__all__ = ["Sharded", "BUCKET_SHARE", "MIN_BUCKET", "PER_BUCKET"]

#: stages 2-3 apply the optimizer's update to each bucket's slices of the shard as soon as their
#: average lands (:class:`collectives.parallel.Zero`'s ``apply``): no averaged shard is held, and
#: a bucket with the block it lands in may take what that shard took; off: the averaged shard is
#: kept whole and updated after backward (the same bits, docs/sharded.md)
PER_BUCKET = True
#: what a rank's gradient buckets may hold at stages 2-3, as a share of the largest shard: with
#: :data:`PER_BUCKET` a bucket and the block of the shard its average lands in (all buckets alive
#: at once) take at most 1/BUCKET_SHARE of a shard, so the gradient held stays within the shard
#: that ZeRO-2 keeps; without it each bucket is at most 1/BUCKET_SHARE of a shard beyond the
#: averaged shard ...
BUCKET_SHARE = 1
#: ... but at least this many elements (64 KiB), or every call's latency would dominate small
#: models
MIN_BUCKET = 1 << 14
#: the stages (of 2 and 3) that start each bucket's reduce-scatter on the progress engine, one
#: in flight, in buckets half as large (read when a mode is made): stage 3, whose layer gathers
#: run there already (the choice measured in docs/sharded.md; bench/sharded_step.py compares
#: both)
PIPELINED: frozenset[int] = frozenset({3})
#: stages 2-3 make each bucket of a block of rows of every owner's part of a layer (a
#: balanced reduce-scatter, landing a quarter of the bucket on each of 4 owners); off:
#: consecutive rows, a bucket inside one shard going the whole ring to its one owner, which
#: lands whole there (with PER_BUCKET: twice the buckets, and measured slower on the emulated
#: cluster; without it, in 1/16-shard buckets, it measured faster: docs/sharded.md)
BALANCED = True


class Sharded(SyncMode):
    """ZeRO stage ``stage`` over ``comm`` (the module docstring).

    Parameters
    ----------
    grads, params
        The model's fusion buffers: allocated where the stage keeps them (:meth:`holds`), else
        their layout only.
    stage
        1, 2 or 3.
    algorithm
        Of the reduce-scatter and allgathers (:data:`collectives.parallel.ALGORITHMS`).
    bucket_bytes
        Largest gradient bucket in bytes (``--bucket-mb``), cut further to a share of a shard.
    seed
        The model's initialisation seed (stage 3 initialises its shard).
    """

    name = "shard"
    forms = "--shard 1|2|3"
    label = "--shard"
    help = "ZeRO stage 1, 2 or 3"
    sharded = True

    def __init__(self, grads: FusionBuffer, params: FusionBuffer, comm: MPI.Comm,
                 clock: Clock | None = None, *, stage: int, algorithm: str = "ring",
                 bucket_bytes: int = 25 << 20, seed: int = 0,
                 state: CompressionState | None = None,
                 param_state: CompressionState | None = None) -> None:
        super().__init__(grads, params, comm, clock)
        self.stage = STAGES[stage]
        self.fans = [s for s in params.shapes if len(s) == 2]
        self.bounds = [params.offsets[2 * i] for i in range(len(self.fans) + 1)]
        self.plan = ShardPlan(tuple(np.diff(self.bounds).tolist()), comm.size)
        #: stage 3: the trailing layers whose forward gathers serve their backward (once, here)
        self.keep = keep_for(self.plan.layers)
        #: ``--codec``: every gradient bucket reduce-scattered compressed (each destination
        #: block on its own; error feedback per bucket and block), at the step pull() names
        self.state, self._step = state, 0
        #: stages 2-3 with :data:`PER_BUCKET`: each bucket's average updates its slices as it
        #: lands (the optimizer and schedule come from :meth:`attach_optimizer`)
        self.applies_update = PER_BUCKET and not self.stage.full_grads
        self.opt: Any = None
        self._lr = 0.0
        self.zero = Zero(self.plan, stage, comm, algorithm=algorithm, ledger=self.ledger,
                         params=params.flat if self.stage.full_params else None,
                         grads=grads.flat if self.stage.full_grads else None,
                         reducer=None if state is None else self._compressed,
                         param_state=param_state, pipelined=stage in PIPELINED,
                         apply=self._apply if self.applies_update else None)
        self.update_params, self.update_grads = self.zero.owned_params, self.zero.owned_grads
        # stages 2-3 hold their buckets within a share of a shard (pipelined: two buckets
        # alive at once, each half as large); stage 1 reduces the whole gradient at once
        alive = 2 if self.zero.pipelined else 1
        #: the largest bucket, in elements (--bucket-mb) ...
        self.limit = max(1, bucket_bytes // 4)
        #: ... and what a bucket (with PER_BUCKET: and the block it lands in) may hold
        self.budget = max(MIN_BUCKET // alive, self.plan.largest // (BUCKET_SHARE * alive))
        self.bucket = max(1, min(self.limit, self.budget))
        if not self.stage.full_params:
            self._initialise(seed)
        self.gather: LayerGather | None = None
        #: each layer's gradient buckets and row blocks (:func:`_row_groups`), made once
        self.row_groups: dict[int, tuple[list, list]] = {}
        self._mark = (0, 0.0)

    def _initialise(self, seed: int) -> None:
        sizes = (self.fans[0][0], *(f[1] for f in self.fans))
        for i, (w, b) in enumerate(initial_layers(sizes, seed)):
            piece = self.plan.split_layer(i, self.comm.rank)
            flat = np.concatenate([w.reshape(-1), b])
            self.zero.owned_params[piece.mine] = flat[piece.local]

    # ------------------------------------------------------------------ the command line
    @classmethod
    def holds(cls, cfg: Any) -> tuple[str, ...]:
        stage = STAGES[cfg.args.shard]
        return (("params",) if stage.full_params else ()) + (
            ("grads",) if stage.full_grads else ())

    @classmethod
    def refusals(cls, value: int, mixing_codec: str | None) -> tuple[Refusal, ...]:
        own = (
            Refusal(("--overlap",), f"--overlap starts allreduces during backward; --shard "
                    f"{value} reduce-scatters the gradient "
                    + ("after backward (stage 1)" if value == 1 else
                       "during backward already, bucket by bucket")),
            GOSSIP_DTYPE,
        )
        if not STAGES[value].full_params:
            own += (Refusal(("--check-replicas",), "--check-replicas compares the ranks' "
                            "parameters; at --shard 3 each rank keeps only its shard"),)
        return own

    @classmethod
    def check(cls, a: argparse.Namespace, value: int) -> str | None:
        if a.algorithm not in ALGORITHMS:
            return (f"--shard {value} reduce-scatters gradients and allgathers parameters: "
                    f"--algorithm must be {' or '.join(ALGORITHMS)}, got {a.algorithm}")
        if a.param_codec:
            try:
                param = CompressionState.from_spec(a.param_codec)
                why = why_not_gather(param.codec, None, auto=param.auto is not None) \
                    or why_not_rounding(param.codec)
            except (ValueError, TypeError) as e:
                why = str(e)
            if why:
                return f"--param-codec {a.param_codec}: {why}"
        if a.codec.startswith("auto:") or a.strategy != "auto":
            return (f"--shard {value} compresses in a reduce-scatter, whose strategy follows "
                    "from the codec: give the codec itself, without auto: or --strategy "
                    "(those choose among the compressed allreduce's)")
        return None

    @classmethod
    def from_config(cls, cfg, value, grads, params, state, comm, clock) -> "Sharded":
        a = cfg.args
        return cls(grads, params, comm, clock, stage=value, algorithm=a.algorithm,
                   bucket_bytes=int(a.bucket_mb * 2**20), seed=a.seed, state=state,
                   param_state=None if not a.param_codec else CompressionState.from_spec(
                       a.param_codec, seed=a.seed, rank=comm.rank))

    # ------------------------------------------------------------------ each step
    def attach_optimizer(self, opt: Any, schedule: Any) -> None:
        self.opt, self.schedule = opt, schedule

    def _apply(self, piece: slice, grad: np.ndarray) -> None:
        """The per-bucket update of the shard's ``piece`` with its averaged ``grad``; at stage 3
        after the layer gather in flight (which reads the shard) has landed."""
        if self.gather is not None:
            self.gather.settle()
        self.opt.step_range(piece.start, piece.stop, grad, self._lr)

    def _compressed(self, x: np.ndarray, *, out: np.ndarray, counts: Sequence[int],
                    key: str) -> Any:
        call = icompressed_reduce_scatter if self.zero.pipelined else compressed_reduce_scatter
        return call(x, self.state, out=out, op="avg", counts=counts, comm=self.comm, key=key,
                    step=self._step)

    def pull(self, step: int) -> None:
        self._step = step
        if self.applies_update:
            self._lr = self.schedule(step)
        self._mark = (TRAFFIC.bytes_sent, self.zero.seconds)
        if not self.stage.full_params:
            self.gather = LayerGather(self.zero, self.bounds, self.keep)

    def backward_hooks(self, step: int) -> dict:
        return {} if self.stage.full_grads else {"layers": _Step(self)}

    def __call__(self, step: int) -> None:
        with self.clock.measure("compute"):
            self.zero.flush()  # the last bucket's reduce-scatter (and its update)
        # what the collectives took inside forward and backward is communication, not compute
        self.clock.seconds["compute"] -= self.zero.seconds - self._mark[1]
        if self.gather is not None:
            self.gather.finish()
            self.gather = None
        if self.stage.full_grads:
            self.zero.reduce_all()

    def average_params(self, step: int) -> None:
        if self.stage.full_params:
            self.zero.gather_params()
        self.ledger.sample()
        st = self.stats
        st.calls += 1
        st.seconds += self.zero.seconds - self._mark[1]
        st.dense_bytes += ring_bytes(4 * self.plan.total, self.comm.size)
        st.bytes_sent += TRAFFIC.bytes_sent - self._mark[0]

    # ------------------------------------------------------------------ evaluation, export
    def forward_hooks(self) -> dict:
        return {} if self.stage.full_params else {"layers": _Gathered(self)}

    def full_params(self) -> np.ndarray | None:
        return self.zero.full_params(root=0)

    def load_owned(self, values: np.ndarray) -> None:
        self.zero.load_owned(values)

    def describe(self) -> str:
        return f"ZeRO stage {self.stage.level} ({self.stage.shards} sharded)"


class _Step:
    """The model's layers for one step at stages 2-3 (a ``LayerSource``): parameters from the
    replica (stage 2) or gathered one ahead (stage 3); gradient blocks as buckets, each
    reduce-scattered to its owners once written, then dropped.

    A bucket holds consecutive rows of the layer, or with :data:`BALANCED` a block of rows of
    every owner's part of it (:func:`_row_groups`), side by side in flat order, so that its
    reduce-scatter gives every owner a share of it; the rows are computed group by group."""

    def __init__(self, mode: Sharded) -> None:
        self.mode, self.zero, self.fans = mode, mode.zero, mode.fans
        self._bias: np.ndarray | None = None
        self._groups: list[_Group] = []
        self._blocks: list[tuple[int, slice, int]] = []  # (group, rows, offset in its bucket)
        self._bucket: np.ndarray | None = None

    def params(self, i: int, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        if self.mode.stage.full_params:
            v = self.mode.params.views
            return v[2 * i], v[2 * i + 1]
        return _split(self.mode.gather.get(i, BACKWARD if backward else FORWARD), self.fans[i])

    def grad_bias(self, i: int) -> np.ndarray:
        self._bias = self.mode.ledger.track("gradients", np.empty(self.fans[i][1], np.float32))
        return self._bias

    def row_blocks(self, i: int) -> Sequence[slice]:
        cache = self.mode.row_groups
        if i not in cache:
            cache[i] = _row_groups(self.mode, i)
        self._groups, self._blocks = cache[i]
        return [rows for _, rows, _ in self._blocks]

    def grad_rows(self, i: int, k: int, rows: slice) -> np.ndarray:
        g, _, at = self._blocks[k]
        group = self._groups[g]
        if at == 0:  # the group's first block: its bucket
            self._bucket = self.mode.ledger.track("gradients",
                                                  np.empty(group.size, np.float32))
        fan_out = self.fans[i][1]
        return self._bucket[at:at + (rows.stop - rows.start) * fan_out].reshape(-1, fan_out)

    def on_ready(self, i: int, k: int) -> None:
        g, _, _ = self._blocks[k]
        if k + 1 < len(self._blocks) and self._blocks[k + 1][0] == g:
            return  # the group's bucket is not full yet
        group, bucket = self._groups[g], self._bucket
        self._bucket = None
        if group.bias:  # the bias follows the layer's last rows in the flat vector
            bucket[-self._bias.size:] = self._bias
            self._bias = None
        self.zero.reduce_group(group.ranges, bucket)


class _Group(NamedTuple):
    """One gradient bucket of a layer: flat ranges (ascending), its size, and whether it ends
    with the layer's bias."""

    ranges: tuple[tuple[int, int], ...]
    size: int
    bias: bool


def _row_groups(mode: Sharded, i: int) -> tuple[list[_Group], list[tuple[int, slice, int]]]:
    """Layer ``i``'s gradient buckets and its row blocks in the order they are computed.

    With :data:`BALANCED` the rows of the layer's weight are split among the owners of their
    first elements (else they are one part); each part's rows are cut into ``m`` near-equal
    blocks (``m`` such that a bucket of one block of every part holds at most ``mode.limit``
    elements, and with the per-bucket update, the bucket and the block it lands in at most
    ``mode.budget``; without it the bucket alone), and bucket ``k`` is block ``k`` of every
    part, in flat order (the bias with the last rows). A layer inside one shard gives
    consecutive buckets of its rows either way."""
    fan_in, fan_out = mode.fans[i]
    lo = mode.bounds[i]
    offsets = mode.plan.offsets
    # the first row of each owner's part: the first whose first element is in its shard
    starts = sorted({min(fan_in, max(0, -(-(a - lo) // fan_out))) for a in offsets[:-1]}
                    | {0, fan_in})
    parts = [(a, b) for a, b in zip(starts, starts[1:]) if b > a] if BALANCED else [(0, fan_in)]
    size = fan_in * fan_out
    # with the per-bucket update a bucket lands in a block of its own: at most its largest
    # part's share of it (balanced; a row more, for a row that straddles two shards, and the
    # bias), or all of it (a bucket of consecutive rows, mostly one owner's)
    lands = (max(b - a for a, b in parts) + 1) * fan_out if mode.applies_update else 0
    m = max(1, -(-size // mode.limit), -(-(size + lands) // max(1, mode.budget)))
    m = min(m, max(b - a for a, b in parts))
    groups: list[_Group] = []
    blocks: list[tuple[int, slice, int]] = []
    for k in range(m):
        ranges, at = [], 0
        for a, b in parts:
            r0, r1 = a + (b - a) * k // m, a + (b - a) * (k + 1) // m
            if r1 == r0:
                continue
            blocks.append((len(groups), slice(r0, r1), at))
            hi = lo + r1 * fan_out + (fan_out if r1 == fan_in else 0)  # and the bias
            ranges.append((lo + r0 * fan_out, hi))
            at += hi - ranges[-1][0]
        if ranges:
            groups.append(_Group(tuple(ranges), at, ranges[-1][1] == mode.bounds[i + 1]))
    return groups, blocks


class _Gathered:
    """Evaluation at stage 3: each layer's parameters gathered when asked for (blocking)."""

    def __init__(self, mode: Sharded) -> None:
        self.mode = mode

    def params(self, i: int, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.mode.bounds[i], self.mode.bounds[i + 1]
        return _split(self.mode.zero.gather_range(lo, hi), self.mode.fans[i])


def _split(flat: np.ndarray, fan: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    fan_in, fan_out = fan
    return flat[:fan_in * fan_out].reshape(fan_in, fan_out), flat[fan_in * fan_out:]
