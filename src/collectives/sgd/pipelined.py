"""``--pipeline S``: the MLP's layers cut into S stages, trained with a pipeline schedule.

The ranks form a mesh ``(dp, pp) = (W / S, S)`` (:class:`collectives.Mesh`): each of the ``W/S``
pipelines (data-parallel replicas) holds the whole model, cut into ``S`` consecutive stages
(:func:`collectives.parallel.pipeline.balanced` by parameter count, or ``--split``); a rank
holds its stage's layers only (:class:`MLPStage`, weights and biases in its own
:class:`~collectives.sgd.fusion.FusionBuffer`). Each step, every replica takes its batch of
``--batch-size`` samples (the training set split over the replicas as
:func:`collectives.sgd.data.shard` splits it over ranks), cuts it into ``--micro-batches`` M
nearly equal micro-batches, and runs ``--schedule`` (GPipe or 1F1B) through
:class:`collectives.parallel.pipeline.Pipeline`: activations and their gradients travel between
neighbor stages with non-blocking point-to-point, every micro-batch's gradient is added to the
stage's (the loss of micro-batch ``m`` divided by the whole batch, so the sum is the batch
mean's gradient). Then the stage's gradient is averaged over its ``dp`` group (the dense
``--sync sync`` exchange on ``Mesh.comm("dp")``) and one momentum-SGD step updates the stage's
parameters: the result is that of the same model trained on the same global batches without a
pipeline, to float32 rounding (the micro-batches' sum adds the batch's gradient in another
order). The initial parameters are those of :class:`~collectives.sgd.model.MLP` with the same
seed (every rank draws the same numbers and keeps its layers').

The driver's ``PipelinedTrainer`` is :class:`Pipelined` over its ``Trainer``. The report adds, per stage, its layers, the bubble measured (seconds waiting for receives and
at the step's end over the step's seconds, :class:`~collectives.parallel.pipeline.StepStats`)
against ``(S-1)/(M+S-1)``, and the peak activation memory (micro-batches held at once, and
their bytes). A checkpoint holds every rank's own stage (parameters, momentum, counters, the bubble's
seconds): a resumed run continues with the same bits.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._runtime import workspace
from ..mesh.mesh import Mesh
from ..parallel.pipeline import RECV_ACT, Pipeline, balanced, given, ideal_bubble
from ..pt2pt.messages import recv, send
from . import checkpoint, data, sync
from .fusion import FusionBuffer
from .model import _log_softmax, loss_gradient
from .optim import SGD, Schedule
from .timing import Clock

#: the fields of a pipelined run's epoch record: the driver's, and the bubble measured so far
HISTORY_KEYS = ("epoch", "step", "loss", "train_acc", "test_loss", "test_acc", "wall_s",
                "eval_s", "bytes_sent", "bubble")

__all__ = ["MLPStage", "Pipelined", "stage_bounds"]

#: the caller tag of the evaluation's messages (training uses the micro-batch numbers)
EVAL_TAG = 1 << 20
#: rows of the test set per evaluation message
EVAL_ROWS = 1024


def stage_bounds(sizes: tuple[int, ...], stages: int, split: tuple[int, ...] | None
                 ) -> tuple[int, ...]:
    """The layer boundaries of the stages: ``--split`` as given, else balanced by each layer's
    parameter count (its FLOPs, up to a factor)."""
    layers = len(sizes) - 1
    if split:
        return given(split, layers)
    return balanced([a * b + b for a, b in zip(sizes, sizes[1:])], stages)


class MLPStage:
    """Layers ``lo:hi`` of the MLP ``sizes`` (ReLU after every layer but the model's last; the
    last stage adds the softmax cross-entropy loss): the executor's
    :class:`~collectives.parallel.pipeline.Stage`."""

    def __init__(self, sizes: tuple[int, ...], lo: int, hi: int, seed: int) -> None:
        self.sizes, self.lo, self.hi = sizes, lo, hi
        self.first, self.last = lo == 0, hi == len(sizes) - 1
        shapes = []
        for i in range(lo, hi):
            shapes += [(sizes[i], sizes[i + 1]), (sizes[i + 1],)]
        self.params = FusionBuffer(shapes)
        self.grads = FusionBuffer(shapes)
        rng = np.random.default_rng(seed)  # MLP's draws, layer by layer; this stage's kept
        for i in range(hi):
            w = rng.standard_normal((sizes[i], sizes[i + 1]), dtype=np.float32) * \
                np.float32(np.sqrt(2.0 / sizes[i]))
            if i >= lo:
                self.params.views[2 * (i - lo)][...] = w
        self.batch = 0
        self.xs: list[np.ndarray] = []
        self.ys: list[np.ndarray] = []
        self.rows: list[int] = []
        self._held: dict[int, tuple[list[np.ndarray], np.ndarray | None]] = {}
        self.held_bytes = self.peak_bytes = 0
        self.loss_sum, self.correct = 0.0, 0

    @property
    def layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        v = self.params.views
        return list(zip(v[::2], v[1::2]))

    def _relu(self, j: int) -> bool:
        return self.lo + j < len(self.sizes) - 2

    def begin(self, x: np.ndarray | None, y: np.ndarray | None, rows: int,
              microbatches: int) -> None:
        """A new step: the replica's batch (``x`` on the first stage, ``y`` on the last, None
        elsewhere) of ``rows`` samples in ``microbatches`` pieces; the gradient set to zero."""
        self.batch = rows
        self.rows = [len(r) for r in np.array_split(np.arange(rows), microbatches)]
        self.xs = np.array_split(x, microbatches) if x is not None else []
        self.ys = np.array_split(y, microbatches) if y is not None else []
        self.grads.flat[...] = 0
        self.loss_sum, self.correct = 0.0, 0

    def buffer(self, kind: str, m: int) -> np.ndarray:
        width = self.sizes[self.lo] if kind == RECV_ACT else self.sizes[self.hi]
        return np.empty((self.rows[m], width), np.float32)

    def _forward(self, h: np.ndarray) -> list[np.ndarray]:
        acts = [h]
        for j, (w, b) in enumerate(self.layers):
            z = acts[-1] @ w + b
            if self._relu(j):
                np.maximum(z, 0, out=z)
            acts.append(z)
        return acts

    def forward(self, m: int, x: np.ndarray | None) -> np.ndarray | None:
        acts = self._forward(self.xs[m] if self.first else x)
        dz = None
        if self.last:  # the loss of the micro-batch, its gradient scaled by the whole batch
            y = self.ys[m]
            logp, dz = loss_gradient(acts[-1], y, self.batch)
            self.loss_sum -= float(logp[np.arange(len(y)), y].sum())
            self.correct += int((logp.argmax(axis=1) == y).sum())
            acts.pop()
        self._held[m] = (acts, dz)
        self.held_bytes += sum(a.nbytes for a in acts) + (dz.nbytes if dz is not None else 0)
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        return None if self.last else acts[-1]

    def backward(self, m: int, dy: np.ndarray | None) -> np.ndarray | None:
        acts, dz = self._held.pop(m)
        self.held_bytes -= sum(a.nbytes for a in acts) + (dz.nbytes if dz is not None else 0)
        if dz is None:  # the gradient of this stage's output, through its ReLU
            dz = dy
            dz *= acts[-1] > 0
        gw, gb = self.grads.views[::2], self.grads.views[1::2]
        for j in range(len(gw) - 1, -1, -1):
            gb[j] += dz.sum(axis=0)
            gw[j] += acts[j].T @ dz
            if j:
                dz = dz @ self.layers[j][0].T
                dz *= acts[j] > 0
            elif not self.first:
                return dz @ self.layers[0][0].T
        return None

    def logits(self, h: np.ndarray) -> np.ndarray:
        """The stage's output on ``h`` (no bookkeeping; the last stage's are logits)."""
        return self._forward(h)[-1]


class Pipelined:
    """What :class:`~collectives.sgd.driver.Trainer` does otherwise with the model cut into
    pipeline stages (module docstring): its own set-up, step, evaluation and summary; the loop
    is the driver's (``driver.PipelinedTrainer`` puts the two together)."""

    def __init__(self, cfg, ds, comm: MPI.Comm) -> None:
        a = self.args = cfg.args
        self.cfg, self.ds, self.comm = cfg, ds, comm
        self.world, self.rank = comm.size, comm.rank
        self.sizes = (ds.features, *cfg.hidden, ds.classes)
        S = a.pipeline
        self.mesh = Mesh((self.world // S, S), names=("dp", "pp"), comm=comm)
        self.replicas = self.mesh.size("dp")
        self.replica, self.stage_index = self.mesh.coords()
        self.bounds = stage_bounds(self.sizes, S, a.split)
        lo, hi = self.bounds[self.stage_index], self.bounds[self.stage_index + 1]
        self.stage = MLPStage(self.sizes, lo, hi, a.seed)
        self.model = self.stage
        self.microbatches = a.micro_batches or S
        self.pipe = Pipeline(a.schedule, self.microbatches, self.mesh.comm("pp"),
                             world=self.mesh.comm())
        self.spe = data.steps_per_epoch(len(ds.y_train), self.replicas, a.batch_size)
        self.total = a.epochs * self.spe
        self.schedule = Schedule(a.lr, a.batch_size * self.replicas,
                                 int(round(a.warmup_epochs * self.spe)), self.total)
        self.state = None
        self.opt = SGD(self.stage.params.flat, a.momentum, a.weight_decay)
        self.clock = Clock()
        self.step_seconds: list[float] = []
        self.exchange = sync.build(cfg, self.stage.grads, self.stage.params, None,
                                   self.mesh.comm("dp"), self.clock)
        # a checkpoint holds every rank's own stage (parameters, momentum, counters)
        self.own_params = self.own_momentum = True
        self.saves_own = (True, True)
        self.speaks, self.job = comm.rank == 0, comm  # rank 0 prints; checkpoints gather all
        self.ledger = self.exchange.ledger  # peak memory per category (the report)
        self.ledger.track("optimizer", self.opt.velocity)
        self.ledger.probe("buffers", workspace.held_bytes)
        self.history_keys = HISTORY_KEYS
        self.coords = None
        self.step = 0
        self.history: list[dict] = []
        self.elapsed = 0.0
        self.epoch_loss = np.zeros(3)
        self.idle_s = self.busy_s = 0.0  # the bubble's seconds and the steps' seconds
        self.peak_held = 0

    # ------------------------------------------------------------------ checkpoint state
    def capture(self) -> tuple[dict, dict, dict]:
        meta, shared, mine = super().capture()
        mine["pipeline"] = np.array([self.idle_s, self.busy_s, self.peak_held], np.float64)
        return meta, shared, mine

    def expected(self) -> tuple[dict[str, checkpoint.Member], dict]:
        """Collective: every rank's own stage (its size), the driver's meta."""
        sizes = self.comm.allgather(self.stage.params.size)
        stats = checkpoint.Member("<f8", self.exchange.stats.as_array().shape)
        members = {"meta": checkpoint.Member.text(checkpoint.META_MAX_CHARS)}
        for r, n in enumerate(sizes):
            members.update({f"rank{r}/params": checkpoint.Member("<f4", (n,)),
                            f"rank{r}/momentum": checkpoint.Member("<f4", (n,)),
                            f"rank{r}/epoch_loss": checkpoint.Member("<f8", (3,)),
                            f"rank{r}/stats": stats,
                            f"rank{r}/pipeline": checkpoint.Member("<f8", (3,))})
        meta = {"version": checkpoint.VERSION, "world": self.world,
                "fingerprint": self.fingerprint, "config": self.config_text,
                "total_steps": self.total, "steps_per_epoch": self.spe, "step_multiple": 1,
                "history_keys": self.history_keys}
        return members, meta

    def restore(self, meta: dict, shared: dict, mine: dict) -> None:
        super().restore(meta, shared, mine)
        self.idle_s, self.busy_s = float(mine["pipeline"][0]), float(mine["pipeline"][1])
        self.peak_held = int(mine["pipeline"][2])

    def shard(self, epoch: int) -> np.ndarray:
        return data.shard(len(self.ds.y_train), self.replicas, self.replica, self.args.seed,
                          epoch)

    def _step(self, order: np.ndarray) -> None:
        a, step, st = self.args, self.step, self.stage
        i = step % self.spe
        batch = order[i * a.batch_size:(i + 1) * a.batch_size]
        st.begin(self.ds.x_train[batch] if st.first else None,
                 self.ds.y_train[batch] if st.last else None, len(batch), self.microbatches)
        stats = self.pipe.step(st)
        self.clock.seconds["compute"] += stats.compute_s
        self.clock.seconds["bubble"] += stats.idle_s
        self.idle_s += stats.idle_s
        self.busy_s += stats.step_s
        self.peak_held = max(self.peak_held, stats.peak_held)
        if st.last:
            self.epoch_loss += (st.loss_sum, st.correct, len(batch))
        self.exchange(step)  # the stage's gradient averaged over its dp group
        with self.clock.measure("compute"):
            self.opt.step(st.grads.flat, self.schedule(step))
        self.step += 1

    def evaluate(self) -> dict:
        """Each replica's pipeline forwards its share of the test set, stage to stage; the last
        stages' counts are summed over every rank."""
        with self.clock.measure("eval"):
            st, pp = self.stage, self.mesh.comm("pp")
            x = self.ds.x_test[self.replica::self.replicas]
            y = self.ds.y_test[self.replica::self.replicas]
            loss, correct = 0.0, 0
            for k, a in enumerate(range(0, len(y), EVAL_ROWS)):
                rows = len(y[a:a + EVAL_ROWS])
                if st.first:
                    h = x[a:a + EVAL_ROWS]
                else:
                    h = recv(np.empty((rows, self.sizes[st.lo]), np.float32),
                             self.stage_index - 1, tag=EVAL_TAG + k, comm=pp)
                z = st.logits(h)
                if not st.last:
                    send(z, self.stage_index + 1, tag=EVAL_TAG + k, comm=pp)
                    continue
                logp = _log_softmax(z)
                loss -= float(logp[np.arange(rows), y[a:a + rows]].sum())
                correct += int((z.argmax(axis=1) == y[a:a + rows]).sum())
            tot = self.comm.allreduce(np.array([loss, correct, *self.epoch_loss]), op=MPI.SUM)
        self.epoch_loss[...] = 0
        return {"epoch": self.step // self.spe, "step": self.step,
                "loss": tot[2] / max(1, tot[4]), "train_acc": tot[3] / max(1, tot[4]),
                "test_loss": tot[0] / len(self.ds.y_test), "test_acc": tot[1] / len(self.ds.y_test),
                "wall_s": self.elapsed + self.run_seconds(), "eval_s": self.clock.seconds["eval"],
                "bytes_sent": self.exchange.stats.bytes_sent,
                "bubble": self.comm.allreduce(self.idle_s, op=MPI.SUM)
                / max(1e-12, self.comm.allreduce(self.busy_s, op=MPI.SUM))}

    def gather_params(self) -> np.ndarray:
        """Collective over the run's communicator (the mesh may be freed): the whole model's
        flat parameters (the stages' of replica 0 in order: the layout of
        :class:`~collectives.sgd.model.MLP`'s fusion buffer), on every rank."""
        parts = self.comm.allgather((self.replica, self.stage_index, self.stage.params.flat
                                     if self.replica == 0 else None))
        return np.concatenate([p for r, _, p in sorted(parts, key=lambda t: t[:2]) if r == 0])

    def params_to_save(self) -> np.ndarray:
        return self._saved

    def summary(self) -> dict:
        self._saved = self.gather_params() if self.args.save_params else None
        s = super().summary()
        per = self.comm.allgather((self.stage_index, self.replica, self.idle_s, self.busy_s,
                                   self.peak_held, self.stage.peak_bytes,
                                   self.stage.params.size))
        stages = []
        for k in range(self.mesh.size("pp")):
            mine = [p for p in per if p[0] == k]
            stages.append({"layers": [self.bounds[k], self.bounds[k + 1]],
                           "params": mine[0][6],
                           "bubble": sum(p[2] for p in mine) / max(1e-12, sum(p[3] for p in mine)),
                           "peak_microbatches": max(p[4] for p in mine),
                           "peak_activation_bytes": max(p[5] for p in mine)})
        s["params"] = sum(st["params"] for st in stages)
        s["label"] += f" pp={len(stages)} {self.args.schedule} M={self.microbatches}"
        s["pipeline"] = {"stages": len(stages), "replicas": self.replicas,
                         "schedule": self.args.schedule, "microbatches": self.microbatches,
                         "ideal_bubble": ideal_bubble(len(stages), self.microbatches),
                         "per_stage": stages}
        return s

    def close(self) -> None:
        self.exchange.close()
        self.pipe.close()
        self.mesh.free()
