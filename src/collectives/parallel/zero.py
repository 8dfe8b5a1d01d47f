"""ZeRO's stages (Rajbhandari et al., SC 2020) over a :class:`~.sharding.ShardPlan`: one rank's side.

Every rank computes the gradient of its own batch; what it keeps between steps, and what crosses
the network, depends on the stage (:data:`STAGES`, one small class each):

- **stage 1** (optimizer state sharded): the whole gradient is written by backward, then
  reduce-scattered (op "avg") in one call, in place, each rank receiving the average of the
  slice it owns in that slice; the owner runs the optimizer on its slice only (its momentum
  is all it keeps of the optimizer), and an allgather of the updated slices, in place, rebuilds
  every rank's full parameters: ring allreduce's two halves with the update between them.
- **stage 2** (gradients sharded too): the same exchange, but each bucket of the gradient is
  reduce-scattered as soon as backward has written it and then freed, so a rank holds the
  averaged gradient of its shard plus a bucket or two, not the whole gradient. A bucket is a
  contiguous range (mostly inside one shard: its reduce-scatter carries it along the whole
  ring to that owner) or a group of ranges side by side (:meth:`Zero.reduce_group`), one
  inside each owner's part of a layer, whose reduce-scatter gives every owner a share. With
  ``pipelined`` each bucket's reduce-scatter runs on the progress engine while backward
  computes the next one (docs/sharded.md measures both choices). With the per-bucket update
  (``apply``) the optimizer updates each bucket's slices of the shard as soon as their average
  lands, so no averaged shard is held beside the buckets: the gradient a rank holds is the
  buckets in flight and the blocks they land in, and buckets as large as a shard fit ZeRO-2's
  memory (momentum SGD and Adam are element by element: the same bits as updating the whole
  shard after backward).
- **stage 3** (parameters sharded too): a rank keeps only its shard of the parameters; before a
  layer's forward, and again before its backward, the layer's parameters are allgathered from
  their owners and freed after use, the next layer's gather running on the progress engine
  (``collectives.iallgather``) while the current layer computes (:mod:`.prefetch`); the
  trailing layers whose keeping adds no memory keep their forward gather for their backward
  (:func:`.prefetch.keep_for`, as FSDP keeps the root's and DeepSpeed reuses parameters
  within ``stage3_max_reuse_distance``); no allgather follows the update.

A parameter codec (``param_state``: fp16, bf16, int8 in buckets) compresses the parameters'
allgathers at every stage (``collectives.compressed_allgather``): each owner keeps its slice in
full precision, the master that the optimizer updates, and every rank, the owner too, computes
with the decoded masters, bitwise the same everywhere. At stage 3 the owned shard is the master;
stages 1-2 keep the master slice beside the replica (1/p of the parameters more per rank) and
allgather it after the update into the replica.

Bytes per step, ``n`` parameters of 4 bytes on ``p`` ranks (ring): stages 1-2 send
``2 n (p-1)/p`` like ring allreduce (a reduce-scatter and an allgather); stage 3 up to 1.5x that
(the parameters are gathered twice, forward and backward, but the kept layers' forward gathers
serve their backward and the first layer needs none there): 1.50x for the deep model of 17
equal-ish layers, 1.0x for the wide one, whose backward gathers nothing.

The reduce-scatter sums every element along the ring that ends at its owner, the order of ring
allreduce over the plan's even split, so with ``algorithm="ring"`` the averaged gradient, and so
the parameters after any number of steps, are those of data parallelism bit for bit, whatever the
buckets.

:class:`Zero` holds one rank's shards and runs these exchanges on flat NumPy arrays; which
arrays a model computes with, and when it calls back, is the trainer's business
(``collectives.sgd.sync.sharded`` for the NumPy driver).
"""

from __future__ import annotations

import time
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
from mpi4py import MPI

from ..api import allgather, gather, reduce_scatter
from ..blocks import ALLGATHER, REDUCE_SCATTER
from ..compressed.shard import compressed_allgather
from ..engine.nonblocking import iallgather, icompressed_allgather, ireduce_scatter
from ..engine.requests import Request
from .memory import MemoryLedger
from .sharding import ShardPlan

__all__ = ["Stage", "Stage1", "Stage2", "Stage3", "STAGES", "Zero", "ALGORITHMS"]

#: the algorithms a sharded exchange runs (reduce-scatter and allgather both have them)
ALGORITHMS = tuple(sorted(set(REDUCE_SCATTER) & set(ALLGATHER)))


class Stage:
    """What a stage keeps and when it exchanges (class attributes only)."""

    level: ClassVar[int]
    #: what is sharded, in words (messages, reports)
    shards: ClassVar[str]
    #: every rank keeps all parameters between steps (stages 1-2)
    full_params: ClassVar[bool] = True
    #: backward writes the whole gradient before it is reduced (stage 1)
    full_grads: ClassVar[bool] = False


class Stage1(Stage):
    """Optimizer state sharded: reduce-scatter after backward, owner update, allgather."""

    level = 1
    shards = "optimizer state"
    full_grads = True


class Stage2(Stage):
    """Gradients sharded too: buckets reduce-scattered during backward, then freed."""

    level = 2
    shards = "optimizer state and gradients"


class Stage3(Stage):
    """Parameters sharded too: layers gathered before forward and backward, freed after."""

    level = 3
    shards = "optimizer state, gradients and parameters"
    full_params = False


#: every stage, by its number (``--shard N``)
STAGES: dict[int, type[Stage]] = {cls.level: cls for cls in (Stage1, Stage2, Stage3)}


class Zero:
    """One rank's shards and exchanges at ``stage`` (the module docstring).

    Parameters
    ----------
    plan
        Who owns which slice (its ``world`` is ``comm.size``).
    stage
        1, 2 or 3 (:data:`STAGES`).
    comm
        The data-parallel communicator.
    params
        Stages 1-2: the full flat parameters every rank keeps (the allgather writes them);
        stage 3: None (the owned shard is allocated here; fill it with :meth:`load_owned`).
    grads
        Stage 1: the full flat gradient backward writes; each rank's averaged shard is written
        into its own slice of it (:meth:`reduce_all`). Stages 2-3: None (the averaged shard is
        allocated here).
    algorithm
        Of the reduce-scatter and the allgathers: one of :data:`ALGORITHMS`.
    ledger
        Where the arrays made here are tracked (shards, staging copies, gathered layers).
    reducer
        How a gradient bucket is averaged onto its owners: called as ``reducer(x, out=...,
        counts=..., key=...)`` with reduce-scatter's arguments and the bucket's name (the same
        at every step: ``"grads.<flat offset>"``, where a compressed reduce-scatter keeps its
        error feedback); None: dense ``collectives.reduce_scatter(..., op="avg")``.
    param_state
        The :class:`~collectives.CompressionState` of a codec the parameters' gathers run
        through (``collectives.compressed_allgather``: every rank, the owner too, computes with
        the same decoded parameters, bitwise, while each owner keeps its shard in full
        precision, the master the optimizer updates); None: dense. Stage 3's owned shard is the
        master; stages 1-2 keep a master slice beside the replica (:attr:`owned_params`, filed
        as ``"master"`` in the ledger), and the replica starts as its decoded view (a
        compressed allgather here, so the constructor is then collective).
    pipelined
        Stages 2-3: :meth:`reduce_group` starts each bucket's reduce-scatter on the progress
        engine and waits for it when the next bucket is ready (or at :meth:`flush`), so that it
        travels while backward computes: two buckets are alive at once instead of one. The
        ``reducer`` then returns the request (``icompressed_reduce_scatter``'s). The same bits.
    apply
        Stages 2-3, the per-bucket update: called as ``apply(piece, grad)`` for every piece of
        the owned shard a bucket's average lands in (``piece`` a slice of the shard, ``grad``
        its averaged gradient), as soon as it lands, so that the optimizer updates that slice
        then (element by element, the update of the whole shard, the same bits). No averaged
        shard is kept (:attr:`owned_grads` is None): the gradient a rank holds is its buckets
        in flight and the blocks they land in. At stage 2 without a parameter codec the update
        writes a copy of the owned shard (:attr:`owned_params`, filed as ``"buffers"``: the
        copy the parameters' allgather sends from, now held across the step), since backward
        still reads the replica while buckets land; at stage 3 the caller must let no gather
        of a slice be in flight while it updates that slice (``LayerGather.settle``).
        None: the averaged shard is kept whole, for an update after backward.

    Raises
    ------
    ValueError
        An unknown stage or algorithm, a plan for another world size, or ``params`` given at
        stage 3 / missing or of the wrong size at stages 1-2.
    """

    def __init__(self, plan: ShardPlan, stage: int, comm: MPI.Comm, *,
                 params: np.ndarray | None = None, grads: np.ndarray | None = None,
                 algorithm: str = "ring",
                 ledger: MemoryLedger | None = None, reducer: Callable[..., Any] | None = None,
                 param_state: Any = None, pipelined: bool = False,
                 apply: Callable[[slice, np.ndarray], None] | None = None) -> None:
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {sorted(STAGES)}, got {stage!r}")
        if apply is not None and STAGES[stage].full_grads:
            raise ValueError("the per-bucket update (apply=) is for stages 2-3: stage 1 "
                             "reduces the whole gradient after backward")
        self.apply = apply
        self.param_state = param_state
        if algorithm not in ALGORITHMS:
            raise ValueError(f"a sharded exchange runs reduce-scatter and allgather: algorithm "
                             f"must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
        if plan.world != comm.size:
            raise ValueError(f"the plan has {plan.world} shards, the communicator {comm.size} ranks")
        self.plan, self.stage, self.comm, self.algorithm = plan, STAGES[stage], comm, algorithm
        self.rank = comm.rank
        self.ledger = MemoryLedger() if ledger is None else ledger
        self.mine = plan.shard(self.rank)
        if self.stage.full_params:
            if params is None or params.size != plan.total:
                raise ValueError(f"stage {stage} keeps the full parameters: pass params of "
                                 f"{plan.total} elements")
            self.params = params
            # with a parameter codec the replica is the masters' decoded view: the owner's
            # master is a slice of its own, which the allgather reads and never writes
            # with the per-bucket update, the copy the update writes while backward reads the
            # replica, which the allgather then sends from
            self.owned_params = self.ledger.track("master", params[self.mine].copy()) \
                if param_state is not None else \
                self.ledger.track("buffers", params[self.mine].copy()) if apply is not None \
                else params[self.mine]
        else:
            if params is not None:
                raise ValueError("stage 3 keeps only the owned shard of the parameters")
            self.params = None
            self.owned_params = self._new("parameters", plan.counts[self.rank])
        if self.stage.full_grads != (grads is not None) or (
                grads is not None and grads.size != plan.total):
            raise ValueError(f"stage {stage} takes " + (
                f"the full gradient of {plan.total} elements" if self.stage.full_grads
                else "no full gradient"))
        self.grads = grads
        #: the averaged gradient of the owned shard (None with the per-bucket update)
        self.owned_grads = grads[self.mine] if grads is not None else None \
            if apply is not None else self._new("gradients", plan.counts[self.rank])
        #: seconds spent in this rank's exchanges (blocking calls and waits)
        self.seconds = 0.0
        self.reducer = self._dense if reducer is None else reducer
        #: stages 2-3: :meth:`reduce_group` starts each bucket on the progress engine
        self.pipelined = bool(pipelined) and not self.stage.full_grads
        self._pending: tuple | None = None
        self._groups: dict[tuple, tuple] = {}
        if self.stage.full_params and param_state is not None:
            self.gather_params()  # every rank computes with the decoded masters from the start

    def _dense(self, x: np.ndarray, *, out: np.ndarray, counts: Sequence[int], key: str) -> Any:
        call = ireduce_scatter if self.pipelined else reduce_scatter
        return call(x, out=out, op="avg", counts=counts, algorithm=self.algorithm,
                    comm=self.comm)

    def _new(self, category: str, count: int) -> np.ndarray:
        return self.ledger.track(category, np.zeros(count, dtype=np.float32))

    # ------------------------------------------------------------------ gradients
    def reduce_range(self, lo: int, grad: np.ndarray) -> None:
        """Average the gradient of the flat range ``[lo, lo + grad.size)`` over the ranks: each
        rank receives its owned piece of it into :attr:`owned_grads` (one reduce-scatter; a
        group of one range, :meth:`reduce_group`)."""
        self.reduce_group([(lo, lo + grad.size)], grad)

    def reduce_group(self, ranges: Sequence[tuple[int, int]], grad: np.ndarray) -> None:
        """Average the gradient of several flat ranges (ascending, disjoint), side by side in
        ``grad``, over the ranks in one reduce-scatter: the concatenation lies in the owners'
        order, so each owner's block is its pieces of every range, and the sum of each element
        runs along the ring that ends at its owner, as for :meth:`reduce_range`. A bucket made
        of a range of every owner's shard keeps the reduce-scatter balanced (a contiguous one
        inside one shard travels the whole ring to that one owner). Named after its first
        range, as :meth:`reduce_range` names a bucket.

        With ``pipelined`` the reduce-scatter is started on the progress engine (the
        ``reducer`` returns its request) and this call returns at once, after waiting for the
        bucket started before (:meth:`flush` waits for the last one): one bucket travels while
        backward computes the next."""
        counts, mine, adjacent = self._group_plan(tuple(ranges))
        own = self.owned_grads
        self.flush()  # counts its own wait (and lands the bucket before, before this one's block)
        out = own[mine[0].start:mine[-1].stop] if mine and adjacent and own is not None else \
            self.ledger.track("gradients", np.empty(counts[self.rank], dtype=np.float32))
        t0 = time.perf_counter()
        req = self.reducer(grad.reshape(-1), out=out, counts=counts,
                           key=f"grads.{ranges[0][0]}")
        self.seconds += time.perf_counter() - t0
        landing = None if not mine or (adjacent and own is not None) else (mine, out)
        if self.pipelined:
            self._pending = (req, landing)
        else:
            self._land(landing)

    def _group_plan(self, ranges: tuple[tuple[int, int], ...]) -> tuple:
        """``(counts, my slices of the shard, whether they are adjacent)`` of a group of
        ranges, made once per group (the same groups come back every step)."""
        plan = self._groups.get(ranges)
        if plan is None:
            pieces = [self.plan.split(lo, hi, self.rank) for lo, hi in ranges]
            counts = [sum(c) for c in zip(*(pc.counts for pc in pieces))]
            mine = [pc.mine for pc in pieces if pc.counts[self.rank]]
            plan = self._groups[ranges] = (
                counts, mine, all(a.stop == b.start for a, b in zip(mine, mine[1:])))
        return plan

    def flush(self) -> None:
        """Wait for the bucket :meth:`reduce_group` left in flight (``pipelined``), if any."""
        if self._pending is None:
            return
        (req, landing), self._pending = self._pending, None
        t0 = time.perf_counter()
        req.wait()
        self.seconds += time.perf_counter() - t0
        self._land(landing)

    def _land(self, landing: tuple | None) -> None:
        """A bucket's received block (``(slices of the shard, block)``) to its pieces of the
        shard: copied into :attr:`owned_grads`, or with the per-bucket update handed to
        ``apply`` piece by piece."""
        if landing is None:
            return
        at = 0
        slices, out = landing
        for sl in slices:
            piece = out[at:at + sl.stop - sl.start]
            if self.apply is None:
                self.owned_grads[sl] = piece
            else:
                self.apply(sl, piece)
            at += sl.stop - sl.start

    def reduce_all(self) -> None:
        """Stage 1: average the whole flat gradient in one reduce-scatter, each rank's average
        landing in its own slice of the gradient: in place for the dense exchange (NCCL's
        layout: the slice is the rank's block of the gradient, which lies in the owners'
        order; the ring works on the gradient itself, leaving partial sums in the other
        slices, which nothing reads), through a block of its own for a ``reducer`` (a codec's
        reduce-scatter reads its input whole). With :meth:`gather_params` (in place too) the
        exchange is ring allreduce's two halves with the update between them: its bytes, its
        order of sums, no copy of the gradient."""
        t0 = time.perf_counter()
        if self.reducer == self._dense:
            self.reducer(self.grads, out=self.owned_grads, counts=self.plan.counts,
                         key="grads.0")
        else:
            block = self.ledger.track("buffers", np.empty_like(self.owned_grads))
            self.reducer(self.grads, out=block, counts=self.plan.counts, key="grads.0")
            self.owned_grads[...] = block
        self.seconds += time.perf_counter() - t0

    # ------------------------------------------------------------------ parameters
    def gather_params(self) -> None:
        """Stages 1-2, after the update: every rank's full parameters from the owned shards (one
        allgather, in place where the owned slice lies inside the result).
        With :attr:`param_state` the owners' masters travel through its codec
        (``collectives.compressed_allgather``) and every rank's replica, the owner's slice too,
        is their decoded view."""
        if self.param_state is None and self.apply is not None:
            # the per-bucket update's copy of the shard, which nothing writes during the call
            t0 = time.perf_counter()
            allgather(self.owned_params, out=self.params, counts=self.plan.counts,
                      algorithm=self.algorithm, comm=self.comm)
            self.seconds += time.perf_counter() - t0
            return
        if self.param_state is not None:
            t0 = time.perf_counter()
            compressed_allgather(self.owned_params, self.param_state, out=self.params,
                                 counts=self.plan.counts, comm=self.comm, key="params")
            self.seconds += time.perf_counter() - t0
            return
        t0 = time.perf_counter()  # in place: the owned slice is this rank's block of params
        allgather(self.owned_params, out=self.params, counts=self.plan.counts,
                  algorithm=self.algorithm, comm=self.comm)
        self.seconds += time.perf_counter() - t0

    def start_gather(self, lo: int, hi: int) -> tuple[Request, np.ndarray]:
        """Stage 3: start gathering the parameters of the flat range ``[lo, hi)`` from their
        owners into a new array (tracked as parameters); ``(request, array)``."""
        piece = self.plan.split(lo, hi, self.rank)
        out = self.ledger.track("parameters", np.empty(hi - lo, dtype=np.float32))
        if self.param_state is None:
            req = iallgather(self.owned_params[piece.mine], out=out, counts=piece.counts,
                             algorithm=self.algorithm, comm=self.comm)
        else:
            req = icompressed_allgather(self.owned_params[piece.mine], self.param_state,
                                        out=out, counts=piece.counts, comm=self.comm,
                                        key=f"params.{lo}")
        return req, out

    def wait(self, req: Request) -> None:
        """Wait for a gather of :meth:`start_gather`, counting the wait."""
        t0 = time.perf_counter()
        req.wait()
        self.seconds += time.perf_counter() - t0

    def gather_range(self, lo: int, hi: int) -> np.ndarray:
        """Stage 3: the parameters of ``[lo, hi)``, gathered now (blocking)."""
        piece = self.plan.split(lo, hi, self.rank)
        out = self.ledger.track("parameters", np.empty(hi - lo, dtype=np.float32))
        t0 = time.perf_counter()
        if self.param_state is None:
            allgather(self.owned_params[piece.mine], out=out, counts=piece.counts,
                      algorithm=self.algorithm, comm=self.comm)
        else:
            compressed_allgather(self.owned_params[piece.mine], self.param_state, out=out,
                                 counts=piece.counts, comm=self.comm, key=f"params.{lo}")
        self.seconds += time.perf_counter() - t0
        return out

    def full_params(self, root: int = 0) -> np.ndarray | None:
        """Collective: the full flat parameters on ``root`` (a copy gathered from the shards at
        stage 3 and from the masters with a parameter codec, else the replica itself at stages
        1-2), None on the other ranks."""
        if self.stage.full_params and self.param_state is None:
            return self.params if self.rank == root else None
        return gather(self.owned_params, root=root, counts=self.plan.counts, comm=self.comm)

    def load_owned(self, values: np.ndarray) -> None:
        """Collective: the owned shard of the parameters (the master, with a parameter codec)
        becomes ``values`` (a checkpoint's); at stages 1-2 the full parameters are then
        gathered again."""
        self.owned_params[...] = values
        if self.stage.full_params:
            self.gather_params()

