"""The training loop of ``python -m collectives.sgd``: set up, train, checkpoint, report.

Each step: forward and backward on this rank's batch (gradient into the fusion buffer), the
sync mode's exchange (:mod:`collectives.sgd.sync`), the momentum-SGD update with the scheduled
learning rate (:mod:`collectives.sgd.optim`); local SGD averages parameters every H steps
instead, gossip (D-PSGD) mixes them with the graph neighbors' after every update. At each epoch's
end the test set is evaluated (split across ranks, counts summed; under gossip each rank
evaluates its own replica, and the record also holds the consensus distance,
:meth:`Trainer.consensus`) and a line printed; every ``--checkpoint-every`` steps a checkpoint
is written (:mod:`collectives.sgd.checkpoint`).

Which state a checkpoint carries, and why resuming gives the same bits as never stopping: the
parameters and momentum, the step, which fixes the data order and the learning rate, and, with a
codec, every rank's ``state.state_dict()`` of its :class:`collectives.CompressionState` and
nothing else of the compression: the error-feedback residuals, the codec's own state (PowerSGD's
warm-start Q, the private generator of QSGD, TernGrad, ...), the "two_phase" strategy's
server-side residuals. Statistics (times, bytes, history) continue from the checkpoint too.
Under gossip the parameters differ between ranks, so every rank's own are saved, with its
momentum (as local SGD's), and on a mesh (``--mesh``, ``--pipeline``, ``--tensor``) every
rank's own shard of both; under
CHOCO-SGD (``--sync gossip:GRAPH --codec``) also every rank's ``ChocoGossip.state_dict()``:
the public copies of itself and its in-neighbors, which the next round's compressed differences
are taken against, and its codec's own state. With ``--shard`` every rank writes its owned
slices of the parameters and momentum to a file of its own (:meth:`Trainer.own`), and
``--save-params`` gathers the full parameters on rank 0.

Every run reports its peak memory per rank by category (parameters, gradients, optimizer state,
codec state, buffers), measured from the arrays the run holds (the sync mode's
:class:`collectives.parallel.MemoryLedger`), and its peak resident set size.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from typing import Callable

import numpy as np
from compress import SparsityWarmup
from mpi4py import MPI

import collectives

from ..compressed import CompressionState
from ..compressed.strategies import STRATEGIES
from . import checkpoint, data, datasets, report, sync
from ..diagnostics import timeline
from .._runtime import workspace
from .._runtime.cli import program
from .cli import PROG, Config, UsageError, parse
from .fusion import FusionBuffer
from .model import MLP
from .optim import SGD, Schedule
from .pipelined import Pipelined
from .timing import Clock

__all__ = ["train", "main", "script"]

#: checkpoint entries (per rank) holding ``state.state_dict()``
STATE_PREFIX = "compression/"
#: checkpoint members of the sync mode's own state (``SyncMode.state_dict()``: CHOCO-SGD's
#: public copies and codec state)
CHOCO_PREFIX = "choco/"
#: the fields of an epoch record (``Trainer.evaluate``, the history a checkpoint holds)
HISTORY_KEYS = ("epoch", "step", "loss", "train_acc", "test_loss", "test_acc", "wall_s",
                "eval_s", "bytes_sent")


def _fingerprint(cfg: Config, sizes: tuple[int, ...]) -> tuple[str, str]:
    fields = dict(cfg.fingerprint_fields(), sizes=list(sizes))
    text = json.dumps(fields, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest(), text


def _params_hash(params: np.ndarray) -> int:
    return int.from_bytes(hashlib.blake2b(params.tobytes(), digest_size=8).digest(), "little")


class Trainer:
    """Everything one rank holds during training."""

    def __init__(self, cfg: Config, ds: datasets.Dataset, comm: MPI.Comm) -> None:
        a = self.args = cfg.args
        self.mesh = None  # a run on a dp x pp x tp mesh is PipelinedTrainer's
        self.speaks = comm.rank == 0  # the rank that prints
        #: the ranks a checkpoint gathers: every rank of the job
        self.job = comm
        self.cfg, self.ds, self.comm = cfg, ds, comm
        self.world, self.rank = comm.size, comm.rank
        self.sizes = (ds.features, *cfg.hidden, ds.classes)
        self.spe = data.steps_per_epoch(len(ds.y_train), self.world, a.batch_size)
        self.total = a.epochs * self.spe
        self.schedule = Schedule(a.lr, a.batch_size * self.world,
                                 int(round(a.warmup_epochs * self.spe)), self.total)
        self.state = self.compression()
        # the buffers the mode needs whole (--shard keeps slices of them instead)
        self.model = MLP(self.sizes, seed=a.seed, hold=cfg.mode.holds(cfg))
        self.clock = Clock()
        self.step_seconds: list[float] = []  # each step's wall time on this rank (the median)
        self.exchange = sync.build(cfg, self.model.grads, self.model.params, self.state, comm,
                                   self.clock)
        # with momentum correction the memory applies the momentum, before compression (DGC)
        self.opt = SGD(self.exchange.update_params,
                       0.0 if a.momentum_correction else a.momentum, a.weight_decay)
        self.exchange.attach_optimizer(self.opt, self.schedule)
        self.ledger = self.exchange.ledger  # peak memory per category (the report)
        self.ledger.track("optimizer", self.opt.velocity)
        self.ledger.probe("buffers", workspace.held_bytes)
        self.track_codec()
        #: where each kind of state is kept in a checkpoint: the same on every rank or its own
        self.own_params = self.exchange.own_params
        self.own_momentum = self.exchange.own_momentum
        #: whether a checkpoint keeps every rank's own parameters and momentum (else rank 0's)
        self.saves_own = (self.own_params, self.own_momentum)
        self.history_keys = HISTORY_KEYS + (("consensus",) if self.own_params else ())
        n, k = self.model.params.size, a.consensus_coords
        #: the coordinates the consensus distance is estimated from (None: all of them, or no
        #: consensus distance: the replicas are one)
        self.coords = None if not self.own_params or not k or k >= n else \
            np.sort(np.random.default_rng([a.seed, 1]).choice(n, k, replace=False))
        self.fingerprint, self.config_text = _fingerprint(cfg, self.sizes)
        self.step = 0
        self.history: list[dict] = []
        self.elapsed = 0.0            # wall seconds of earlier runs of this job (resume)
        self.epoch_loss = np.zeros(3)  # loss sum, correct, samples of the current epoch

    def compression(self) -> CompressionState | None:
        """This rank's compression state of ``--codec`` (None without one); raises UsageError
        (the same on every rank) for a codec or strategy that cannot run."""
        a = self.args
        if not self.cfg.codec_name:
            return None
        try:
            state = self.build(self.rank)
        except (ValueError, TypeError) as e:
            raise UsageError(f"--codec {a.codec}: {e}") from None
        problem = STRATEGIES[a.strategy].why_not(
            state.codec, state.memory, auto=state.auto is not None) \
            if a.strategy != "auto" else None
        if problem:
            raise UsageError(problem)
        return state

    def track_codec(self) -> None:
        """The codec's state in the memory ledger (the report's peak memory)."""
        if self.state is not None:
            self.ledger.probe("codec", self.state.held_nbytes)

    def build(self, rank: int) -> CompressionState:
        """The compression state of ``rank`` for ``--codec`` (and DGC's options)."""
        a = self.args
        dgc = None
        if a.momentum_correction:  # the paper's clipping threshold is global: N ** -0.5 per rank
            dgc = {"momentum": a.momentum,
                   "clip": None if a.clip is None else a.clip / math.sqrt(self.world),
                   "warmup": SparsityWarmup(self.spe, a.sparsity_warmup)
                   if a.sparsity_warmup else None}
        return CompressionState.from_spec(a.codec, seed=a.seed, rank=rank,
                                          error_feedback=a.error_feedback,
                                          momentum_correction=dgc, start_step=a.dense_steps,
                                          residual_dtype=a.residual_dtype)

    # ------------------------------------------------------------------ checkpoint state
    def capture(self) -> tuple[dict, dict, dict]:
        """(meta, shared, mine) of the state after ``self.step`` steps (a sharded run's owned
        slices: :meth:`own`)."""
        shared: dict[str, np.ndarray] = {}
        mine: dict[str, np.ndarray] = {"epoch_loss": self.epoch_loss,
                                       "stats": self.exchange.stats.as_array()}
        if not self.exchange.sharded:
            (mine if self.saves_own[0] else shared)["params"] = self.exchange.saved_params()
            (mine if self.saves_own[1] else shared)["momentum"] = self.opt.velocity
        if self.state is not None:  # all of the compression's state, and nothing else of it
            mine.update({STATE_PREFIX + k: v for k, v in self.state.state_dict().items()})
        # the mode's own state (CHOCO-SGD: the public copies, the codec's state)
        mine.update({CHOCO_PREFIX + k: v for k, v in self.exchange.state_dict().items()})
        meta = {"version": checkpoint.VERSION, "step": self.step, "world": self.job.size,
                "fingerprint": self.fingerprint, "config": self.config_text,
                "history": self.history, "elapsed": self.elapsed + self.run_seconds(),
                "clock": dict(self.clock.seconds)}
        return meta, shared, mine

    def own(self) -> dict[str, np.ndarray] | None:
        """What this rank writes in its own checkpoint file: with ``--shard``, its owned slices
        of the parameters and the momentum; else None (no such file)."""
        if not self.exchange.sharded:
            return None
        return {"params": self.exchange.update_params, "momentum": self.opt.velocity}

    def own_layout(self) -> dict[str, checkpoint.Member] | None:
        """The members of :meth:`own`, to check a checkpoint's against."""
        own = self.own()
        return None if own is None else {k: checkpoint.Member.like(v) for k, v in own.items()}

    def expected(self) -> tuple[dict[str, checkpoint.Member], dict]:
        """Collective: what a checkpoint of this run holds, to check one against before resuming:
        every member (dtype and shape) and what ``meta`` must say.

        A codec's state gets its layout (names, dtypes, shapes of ``state.state_dict()`` on every
        rank) from one exchange of a random gradient with a fresh state: the same calls create
        the same entries as in training, whatever the codec, memory and strategy."""
        n = self.model.params.size
        members = {"meta": checkpoint.Member.text(checkpoint.META_MAX_CHARS)}
        mine = {"epoch_loss": checkpoint.Member("<f8", (3,)),
                "stats": checkpoint.Member("<f8", self.exchange.stats.as_array().shape)}
        for name, own in zip(("params", "momentum"), self.saves_own):
            if self.exchange.sharded:  # in the ranks' own files
                continue
            if own:  # local SGD's momentum, gossip's parameters and momentum: every rank's own
                mine[name] = checkpoint.Member("<f4", (n,))
            else:
                members[f"shared/{name}"] = checkpoint.Member("<f4", (n,))
        for r in range(self.job.size):
            members.update({f"rank{r}/{k}": v for k, v in mine.items()})
            members.update({f"rank{r}/{CHOCO_PREFIX}{k}": v
                            for k, v in self.exchange.state_layout(r).items()})
        meta = {"version": checkpoint.VERSION, "world": self.job.size,
                "fingerprint": self.fingerprint, "config": self.config_text,
                "total_steps": self.total, "steps_per_epoch": self.spe,
                "step_multiple": self.cfg.local_every or 1, "history_keys": self.history_keys}
        return self.with_state(members), meta

    def with_state(self, members: dict[str, checkpoint.Member]
                   ) -> dict[str, checkpoint.Member] | Callable[[dict], dict]:
        """Collective over the job: ``members`` and every rank's compression state's, or (with
        ``--dense-steps``) the function of the saved meta that picks them."""

        def with_state(step: int) -> dict[str, checkpoint.Member]:
            layouts = self.job.gather(self._state_layout(step), root=0) or [{}] * self.job.size
            return {**members, **{f"rank{r}/{STATE_PREFIX}{k}": v
                                  for r, layout in enumerate(layouts) for k, v in layout.items()}}

        dense = self.args.dense_steps
        if not dense or self.state is None:
            return with_state(0)
        # --dense-steps: a checkpoint of the dense steps holds no memory (or codec state) yet
        early, late = with_state(0), with_state(dense)
        return lambda saved: late if saved["step"] > dense else early

    def _state_layout(self, step: int) -> dict[str, checkpoint.Member]:
        """The layout of this rank's compression state after an exchange at ``step``."""
        if self.state is None:
            return {}
        a = self.args
        state = self.build(self.rank)
        grads = FusionBuffer(self.model.grads.shapes)
        grads.flat[...] = np.random.default_rng(self.rank).standard_normal(grads.size)
        exchange = sync.Synchronous(grads, grads, self.exchange.comm, Clock(), state=state,
                                    algorithm=a.algorithm, strategy=a.strategy,
                                    bucket_bytes=self.exchange.bucket_bytes)
        hooks = exchange.backward_hooks(step)  # --overlap: every bucket, as backward starts them
        for layer in range(len(grads.shapes) // 2 if hooks else 0):
            for block in range(len(hooks["row_blocks"](layer))):
                hooks["on_ready"](layer, block)
        exchange(step)
        return {k: checkpoint.Member.like(v) for k, v in state.state_dict().items()}

    def check_state(self, meta: dict, shared: dict, ranks: list[dict]) -> None:
        """Rank 0, before resuming: every rank's compression state loads into a fresh state for
        that rank (generator states parse), and its step counters are within ``[0, step]``."""
        if self.state is None:
            return
        step = meta["step"]
        for r, entries in enumerate(ranks):
            state = {k[len(STATE_PREFIX):]: v for k, v in entries.items()
                     if k.startswith(STATE_PREFIX)}
            for k, v in state.items():
                if v.dtype.kind in "iu" and not 0 <= int(v) <= step:
                    raise ValueError(f"checkpoint: rank {r}'s {k} is {int(v)}, not in [0, {step}]")
            try:
                self.build(r).load_state_dict(state)
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"checkpoint: rank {r}'s compression state does not load: "
                                 f"{' '.join(str(e).split())[:200]}") from None

    def restore(self, meta: dict, shared: dict, mine: dict) -> None:
        self.step = int(meta["step"])
        self.history = list(meta["history"])
        self.elapsed = float(meta["elapsed"])
        self.clock.seconds.update(meta["clock"])
        if self.exchange.sharded:
            self.exchange.load_owned(mine["params"])
            self.opt.velocity[...] = mine["momentum"]
        else:
            self.model.params.flat[...] = (mine if self.saves_own[0] else shared)["params"]
            self.opt.velocity[...] = (mine if self.saves_own[1] else shared)["momentum"]
        self.epoch_loss[...] = mine["epoch_loss"]
        self.exchange.stats.load(mine["stats"])
        self.exchange.restore(self.step)  # parameters kept elsewhere (server, windows)
        if self.state is not None:
            self.state.load_state_dict({k[len(STATE_PREFIX):]: v for k, v in mine.items()
                                        if k.startswith(STATE_PREFIX)})
        self.exchange.load_state_dict({k[len(CHOCO_PREFIX):]: v for k, v in mine.items()
                                       if k.startswith(CHOCO_PREFIX)})

    # ------------------------------------------------------------------ training
    def run_seconds(self) -> float:
        return time.perf_counter() - self.t_start

    def average(self) -> np.ndarray:
        """Collective: the replicas' average, one allreduce of the parameters in their own dtype
        (outside the steps' time: the "eval" clock)."""
        return collectives.allreduce(self.model.params.flat, op="avg", algorithm="ring",
                                     comm=self.comm)

    def consensus(self, mean: np.ndarray | None) -> float:
        """Collective: the consensus distance, how far the replicas are from their average,
        ``sqrt(mean_i ||x_i - xbar||^2)`` over the ranks' parameter vectors (Kong et al. 2021's
        Xi; the squares summed in float64). From every coordinate against ``mean``, the
        replicas' average (:meth:`average`); without it, estimated from the coordinates
        :attr:`coords` (their own average: an allreduce of ``len(coords)`` values), the sum of
        squares scaled by ``n / len(coords)``: unbiased for the sum over all ``n``, as the
        coordinates are drawn uniformly without replacement."""
        x, scale = self.model.params.flat, 1.0
        if mean is None:
            x = x[self.coords]
            mean = collectives.allreduce(x, op="avg", algorithm="ring", comm=self.comm)
            scale = self.model.params.flat.size / self.coords.size
        local = np.array([float(np.sum(np.square(x - mean), dtype=np.float64))])
        return math.sqrt(scale * float(self.comm.allreduce(local, op=MPI.SUM)[0]) / self.world)

    def evaluate(self) -> dict:
        """Epoch record: mean batch loss and accuracy of the epoch, test loss and accuracy
        (under gossip: of each rank's own replica on its share of the test set, or with
        ``--eval-model average`` of the replicas' average), and under
        gossip the consensus distance. ``eval_s``: the evaluations' seconds so far; where the
        ranks keep their own parameters (gossip, asynchronous runs) their epochs end at different
        times, and the wait for the last rank is counted apart ("epoch_wait"), not as evaluation."""
        if self.own_params:  # the ranks' epochs end apart: waiting for the last is training time
            with self.clock.measure("epoch_wait"):
                self.comm.Barrier()
        with self.clock.measure("eval"):
            x, y = self.ds.x_test[self.rank::self.world], self.ds.y_test[self.rank::self.world]
            mean = self.average() if self.own_params and (
                self.coords is None or self.args.eval_model == "average") else None
            if mean is not None and self.args.eval_model == "average":
                own = self.model.params.flat.copy()
                self.model.params.flat[...] = mean
                try:
                    loss, correct = self.model.evaluate(x, y)
                finally:
                    self.model.params.flat[...] = own
            else:
                loss, correct = self.model.evaluate(x, y, **self.exchange.forward_hooks())
            tot = self.comm.allreduce(np.array([loss, correct, *self.epoch_loss]), op=MPI.SUM)
            spread = self.consensus(mean) if self.own_params else None
        self.epoch_loss[...] = 0
        record = {"epoch": self.step // self.spe, "step": self.step,
                  "loss": tot[2] / max(1, tot[4]), "train_acc": tot[3] / max(1, tot[4]),
                  "test_loss": tot[0] / len(self.ds.y_test),
                  "test_acc": tot[1] / len(self.ds.y_test),
                  "wall_s": self.elapsed + self.run_seconds(),
                  "eval_s": self.clock.seconds["eval"],
                  "bytes_sent": self.exchange.stats.bytes_sent}
        if spread is not None:
            record["consensus"] = spread
        return record

    def shard(self, epoch: int) -> np.ndarray:
        """This rank's training samples of ``epoch``, in visiting order."""
        return data.shard(len(self.ds.y_train), self.world, self.rank, self.args.seed, epoch)

    def params_to_save(self) -> np.ndarray | None:
        """What ``--save-params`` writes (rank 0): the model's parameters, gathered from the
        owners' shards with ``--shard`` (collective: every rank calls it)."""
        return self.exchange.full_params()

    def close(self) -> None:
        self.exchange.close()

    def one_step(self, order: np.ndarray) -> None:
        t0 = time.perf_counter()
        with self.clock.measure("step"):
            self._step(order)
        self.step_seconds.append(time.perf_counter() - t0)

    def _step(self, order: np.ndarray) -> None:
        a, step = self.args, self.step
        i = step % self.spe
        batch = order[i * a.batch_size:(i + 1) * a.batch_size]
        self.exchange.pull(step)  # --sync ssp:S / async: the server's parameters
        self.exchange.start_mix(step)  # --sync gossip --overlap: mixing x_t, during backward
        with self.clock.measure("compute"):
            loss, correct = self.model.loss_and_grad(self.ds.x_train[batch], self.ds.y_train[batch],
                                                     **self.exchange.backward_hooks(step))
        self.epoch_loss += (loss * len(batch), correct, len(batch))
        self.exchange(step)
        self.exchange.finish_mix(step)  # ... the parameters are now the mixed x_t
        with self.clock.measure("compute"):
            if not self.exchange.applies_update:  # --shard 2-3: applied as buckets land
                self.opt.step(self.exchange.update_grads, self.schedule(step))
        self.exchange.average_params(step)
        if a.check_replicas and self.exchange.exchanges_at(step):
            hashes = self.comm.allgather(_params_hash(self.model.params.flat))
            if len(set(hashes)) > 1:
                raise RuntimeError(f"replicas differ after step {step}: hashes {hashes}")
        self.step += 1

    def train(self) -> bool:
        """Train from ``self.step`` to the end (or ``--stop-after``); False if stopped early."""
        from tqdm import tqdm

        a = self.args
        # a with block: an exception clears the bar first, so its message gets its own line
        with tqdm(total=self.total, initial=self.step, desc=PROG, unit="step", leave=False,
                  disable=a.quiet or not self.speaks, file=sys.stderr) as bar:
            order = None
            while self.step < self.total:
                if order is None or self.step % self.spe == 0:
                    order = self.shard(self.step // self.spe)
                self.one_step(order)
                bar.update()
                if self.step % self.spe == 0:
                    self.history.append(self.evaluate())
                    if not a.quiet and self.speaks:
                        bar.write(report.epoch_line(self.history[-1]), file=sys.stderr)
                if a.checkpoint_every and self.step % a.checkpoint_every == 0:
                    with self.clock.measure("checkpoint"):
                        checkpoint.save(a.checkpoint_dir, *self.capture(), self.job,
                                        own=self.own())
                if a.stop_after and self.step >= a.stop_after and self.step < self.total:
                    return False
        return True

    def summary(self) -> dict:
        st = self.exchange.stats
        sent = self.comm.allgather(st.bytes_sent)
        # the slowest rank's median step: steps are synchronous, so it is everyone's
        median = self.comm.allreduce(float(np.median(self.step_seconds))
                                     if self.step_seconds else 0.0, op=MPI.MAX)
        last = self.history[-1] if self.history else {}
        secs = dict(self.clock.seconds)
        # --overlap: the codec runs on the engine thread, beside backward and the wait
        secs["comm"] = st.seconds - (0.0 if self.args.overlap else secs.get("codec", 0.0))
        a = self.args
        ef = self.state is not None and self.state.error_feedback is not None
        mc = " + momentum correction" if a.momentum_correction else ""
        # a plot's legend: "dense ring", "topk+ef ring", "dense ring async"
        codec = "dense" if a.codec == "none" else f"{a.codec}{'+ef' if ef else ''}"
        memory = self.ledger.report()
        ranks = self.comm.allgather(memory)
        return {"label": f"{codec}{'+mc' if mc else ''} {a.algorithm}"
                         + (f" {a.sync}" if a.sync != "sync" else "")
                         + (f" zero{a.shard}" if a.shard else ""),
                "shard": a.shard or 0,
                # peak bytes per category: the largest over the ranks, and every rank's
                "memory": {k: max(m[k] for m in ranks) for k in memory},
                "memory_ranks": ranks,
                "world": self.world, "params": self.model.params.size, "steps": self.step,
                "codec": a.codec + (" + error feedback" if ef else "")
                + (f" ({a.residual_dtype} residuals)" if ef and a.residual_dtype else "") + mc,
                "algorithm": a.algorithm, "sync": a.sync, "hidden": list(self.cfg.hidden),
                "loss": last.get("loss", float("nan")), "train_acc": last.get("train_acc", 0.0),
                "test_acc": last.get("test_acc", 0.0), "seconds": secs,
                "wall_s": self.elapsed + self.run_seconds(), "analytic": self.exchange.analytic,
                "exchanges": st.calls, "bytes_mean": float(np.mean(sent)),
                "step_median_s": median,
                "overlap": a.overlap and not self.exchange.mix_ahead,
                "mix_ahead": self.exchange.mix_ahead,
                "gossip_dtype": None if self.exchange.wire is None else str(self.exchange.wire),
                "comm_busy": st.busy, "comm_hidden": st.hidden,
                "bytes_max": int(max(sent)), "dense_bytes": st.dense_bytes,
                "consensus": last.get("consensus"),
                "auto": None if self.state is None or self.state.auto is None
                else self.state.auto.summary(),
                "auto_report": None if self.state is None or self.state.auto is None
                else self.state.auto.report()}


class PipelinedTrainer(Pipelined, Trainer):
    """``--mesh``, ``--pipeline S``, ``--tensor T``: the trainer of a model on a dp x pp x tp
    mesh, cut into stages whose layer pairs are split (:mod:`collectives.sgd.pipelined`)."""

    def __init__(self, cfg: Config, ds: datasets.Dataset, comm: MPI.Comm) -> None:
        super().__init__(cfg, ds, comm)
        self.fingerprint, self.config_text = _fingerprint(cfg, self.sizes)


def limit_threads(world: int) -> None:
    """Give each rank's BLAS its share of the cores: ranks are processes already, and BLAS
    threads of several ranks fighting over the same cores make every matrix product slower."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(max(1, (os.cpu_count() or 1) // world))


def train(argv: list[str] | None = None, comm: MPI.Comm | None = None) -> dict | None:
    """Run the driver on ``comm`` (default COMM_WORLD); the summary, or None if stopped early.

    Raises
    ------
    UsageError
        Bad arguments or checkpoint; raised on every rank alike, before any message is sent (a
        checkpoint's verdict is broadcast by rank 0).
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    pre = parse(argv, comm.size, 10**12)  # the data set's name must be valid before loading it
    ds = datasets.load(pre.args.dataset, pre.args.subset)
    cfg = parse(argv, comm.size, len(ds.y_train))
    limit_threads(comm.size)
    t = (PipelinedTrainer if cfg.mesh else Trainer)(cfg, ds, comm)
    t.t_start = time.perf_counter()
    if cfg.args.resume:
        try:
            t.restore(*checkpoint.load(cfg.args.checkpoint_dir, *t.expected(), comm,
                                       check=t.check_state, own=t.own_layout()))
        except ValueError as e:
            raise UsageError(str(e)) from None
    if cfg.args.timeline:
        timeline.start(cfg.args.timeline, comm)
    finished = t.train()
    t.close()
    if cfg.args.timeline:
        written = timeline.stop()
        if written and not cfg.args.quiet:
            print(f"{PROG}: wrote the timeline {written}", file=sys.stderr)
    if not finished:
        if t.speaks and not cfg.args.quiet:
            print(f"{PROG}: stopped after step {t.step} (--stop-after)", file=sys.stderr)
        if t.mesh is not None:
            t.mesh.free()
        return None
    s = t.summary()
    # what --save-params writes: the unsplit model (collective on a mesh and with --shard)
    params = t.params_to_save() if cfg.args.save_params else None
    if t.speaks:
        _outputs(t, s, params)
    if t.mesh is not None:
        t.mesh.free()
    return s


def _outputs(t: Trainer, s: dict, params: np.ndarray | None) -> None:
    a = t.args
    print(report.final_report(s), flush=True)
    if a.save_params:
        tmp = a.save_params + ".tmp.npy"
        np.save(tmp, params)
        os.replace(tmp, a.save_params)
    if a.log:
        report.write_log(a.log, t.history, s)
        print(f"wrote {a.log}", flush=True)
    if a.plot:
        report.plot({s["label"]: t.history}, a.plot)
        print(f"wrote {a.plot}", flush=True)


def main(argv: list[str] | None = None, comm: MPI.Comm | None = None) -> int:
    """Command-line entry: 0 on success, 2 on a usage error (one line, printed by rank 0)."""
    try:
        train(argv, comm)
    except UsageError as e:  # every rank reaches the same verdict: rank 0 says it
        if (MPI.COMM_WORLD if comm is None else comm).rank == 0 or not e.uniform:
            print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


#: ``python -m collectives.sgd`` and the console script ``collectives-sgd``: an error on any rank
#: ends the job (one line on that rank, then MPI_Abort: ``_runtime.cli.program``), never a hang.
script = program(PROG, main)
