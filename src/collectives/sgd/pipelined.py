"""The model on a ``dp x pp x tp`` mesh: pipeline stages whose hidden-layer pairs are split
Megatron-style, replicas averaging their gradients (``--mesh``, ``--pipeline``, ``--tensor``).

The ranks form a :class:`collectives.Mesh` of shape ``(dp, pp, tp)`` (``--mesh dp=A,pp=B,tp=C``;
``--pipeline S`` is the mesh ``(W/S, S, 1)``, ``--tensor T`` the mesh ``(W/T, 1, T)``, both
together ``(W/(S T), S, T)``: one code path for all of them). Along ``pp`` the model's layers are
cut into ``S`` consecutive stages (:func:`collectives.parallel.pipeline.balanced` by parameter
count, or ``--split``); along ``tp`` each consecutive pair of hidden layers is split as
:mod:`collectives.parallel.tensor` splits an MLP block (the first by columns, the second by rows,
:func:`collectives.sgd.tensor_parallel.plan`; an unpaired hidden layer and the output layer
whole on every rank of the axis); along ``dp`` the replicas train on their own batches.

A rank holds its stage's layers only, its shard of each split one (:class:`MLPStage`, weights
and biases in its own :class:`~collectives.sgd.fusion.FusionBuffer`). A pair may straddle a stage
boundary: the activation between a column and a row layer is a block of columns, and the rank at
``tp`` coordinate ``t`` of one stage sends its block to the rank at ``t`` of the next (the ``pp``
communicator joins the ranks of one ``(dp, tp)`` coordinate), so the stages' messages carry
``1/T`` of the width there. Each step, every replica takes its batch of ``--batch-size`` samples
(the training set split over the ``dp`` replicas as :func:`collectives.sgd.data.shard` splits it
over ranks), cuts it into ``--micro-batches`` M nearly equal micro-batches, and runs
``--schedule`` (GPipe or 1F1B) through :class:`collectives.parallel.pipeline.Pipeline`:
activations and their gradients travel between neighbor stages with non-blocking
point-to-point; inside a stage the row layers' outputs and the column layers' input gradients
are summed over ``tp`` by one allreduce each (``--algorithm``); every micro-batch's gradient is
added to the stage's (the loss of micro-batch ``m`` divided by the whole batch, so the sum is
the batch mean's gradient). Then the shard's gradient is averaged over its ``dp`` group (the
dense ``--sync sync`` exchange on ``Mesh.comm("dp")``) and one momentum-SGD step updates it: the
result is that of the same model trained on the same global batches in one process, to float32
rounding (the micro-batches' sum and the row layers' partial products add in another order).
The initial parameters are those of :class:`~collectives.sgd.model.MLP` with the same seed
(every rank draws the same numbers and keeps its layers' slices).

The driver's ``PipelinedTrainer`` is :class:`Pipelined` over its ``Trainer``. The report adds,
per stage, its layers, the bubble measured (seconds waiting for receives and at the step's end
over the step's seconds, :class:`~collectives.parallel.pipeline.StepStats`) against
``(S-1)/(M+S-1)``, and the peak activation memory (micro-batches held at once, and their bytes);
and per axis the communication's seconds and bytes sent per rank: ``dp`` the gradient exchange,
``pp`` the activations and gradients sent to the neighbor stages (seconds: the waits for their
receives, the bubble included), ``tp`` the allreduces inside the stages (counted by
``collectives.TRAFFIC``; the evaluation's forwards included). A checkpoint holds every rank's own
shard (parameters, momentum, counters, the bubble's seconds, the axes' statistics): a resumed
run continues with the same bits.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
from mpi4py import MPI

from .._runtime import workspace
from .._runtime.traffic import TRAFFIC
from ..api import allreduce
from ..mesh.mesh import Mesh
from ..parallel.pipeline import RECV_ACT, Pipeline, balanced, given, ideal_bubble
from ..pt2pt.messages import recv, send
from . import checkpoint, data, sync
from .fusion import FusionBuffer
from .model import _log_softmax, loss_gradient
from .optim import SGD, Schedule
from .tensor_parallel import plan
from .timing import Clock

#: the fields of a pipelined run's epoch record: the driver's, and the bubble measured so far
HISTORY_KEYS = ("epoch", "step", "loss", "train_acc", "test_loss", "test_acc", "wall_s",
                "eval_s", "bytes_sent", "bubble")

__all__ = ["MLPStage", "Pipelined", "stage_bounds", "stage_shapes", "MESH_AXES"]

#: the mesh's axes, outermost first (``--mesh dp=A,pp=B,tp=C``)
MESH_AXES = ("dp", "pp", "tp")

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


def stage_shapes(sizes: tuple[int, ...], lo: int, hi: int, tensor: int
                 ) -> list[tuple[int, ...]]:
    """The tensors a rank of the stage holding layers ``lo:hi`` keeps on a ``tp`` axis of
    ``tensor`` ranks: weight then bias of each layer, a column layer's ``1/T`` of the output
    columns, a row layer's ``1/T`` of the input rows (its bias whole)."""
    kinds = plan(sizes) if tensor > 1 else ["replicated"] * (len(sizes) - 1)
    shapes: list[tuple[int, ...]] = []
    for i in range(lo, hi):
        n_in, n_out = sizes[i], sizes[i + 1]
        if kinds[i] == "column":
            shapes += [(n_in, n_out // tensor), (n_out // tensor,)]
        elif kinds[i] == "row":
            shapes += [(n_in // tensor, n_out), (n_out,)]
        else:
            shapes += [(n_in, n_out), (n_out,)]
    return shapes


class MLPStage:
    """Layers ``lo:hi`` of the MLP ``sizes`` (ReLU after every layer but the model's last; the
    last stage adds the softmax cross-entropy loss), their hidden pairs split over ``tp`` (None
    or one rank: whole): the executor's :class:`~collectives.parallel.pipeline.Stage`."""

    def __init__(self, sizes: tuple[int, ...], lo: int, hi: int, seed: int,
                 tp: MPI.Comm | None = None, algorithm: str = "ring") -> None:
        self.sizes, self.lo, self.hi = sizes, lo, hi
        self.first, self.last = lo == 0, hi == len(sizes) - 1
        self.tp, self.algorithm = tp, algorithm
        T = 1 if tp is None else tp.size
        r = 0 if tp is None else tp.rank
        self.kinds = (plan(sizes) if T > 1 else ["replicated"] * (len(sizes) - 1))[lo:hi]
        shapes = stage_shapes(sizes, lo, hi, T)
        self.params = FusionBuffer(shapes)
        self.grads = FusionBuffer(shapes)
        rng = np.random.default_rng(seed)  # MLP's draws, layer by layer; this shard's kept
        for i in range(hi):
            w = rng.standard_normal((sizes[i], sizes[i + 1]), dtype=np.float32) * \
                np.float32(np.sqrt(2.0 / sizes[i]))
            if i < lo:
                continue
            kind, view = self.kinds[i - lo], self.params.views[2 * (i - lo)]
            block = slice(r * view.shape[1], (r + 1) * view.shape[1]) if kind == "column" \
                else slice(r * view.shape[0], (r + 1) * view.shape[0])
            view[...] = w[:, block] if kind == "column" else w[block] if kind == "row" else w
        #: the widths of the activation received (the input) and of the gradient received (of
        #: the output): a block of columns after a column layer
        self.in_width = sizes[lo] // T if lo and plan(sizes)[lo - 1] == "column" and T > 1 \
            else sizes[lo]
        self.out_width = sizes[hi] // T if self.kinds[-1] == "column" else sizes[hi]
        self.batch = 0
        self.xs: list[np.ndarray] = []
        self.ys: list[np.ndarray] = []
        self.rows: list[int] = []
        self._held: dict[int, tuple[list[np.ndarray], np.ndarray | None]] = {}
        self.held_bytes = self.peak_bytes = 0
        self.loss_sum, self.correct = 0.0, 0
        #: statistics: the tp allreduces' seconds and bytes sent (collectives.TRAFFIC), the
        #: bytes handed to the executor to send to the neighbor stages
        self.tp_seconds, self.tp_bytes, self.pp_bytes = 0.0, 0, 0

    @property
    def layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        v = self.params.views
        return list(zip(v[::2], v[1::2]))

    def _relu(self, j: int) -> bool:
        return self.lo + j < len(self.sizes) - 2

    def _allreduce(self, x: np.ndarray) -> np.ndarray:
        """``x`` summed over the tp axis, in place (Megatron's ``g`` in forward, ``f`` in
        backward)."""
        t0, sent = time.perf_counter(), TRAFFIC.bytes_sent
        allreduce(x, out=x, algorithm=self.algorithm, comm=self.tp)
        self.tp_seconds += time.perf_counter() - t0
        self.tp_bytes += TRAFFIC.bytes_sent - sent
        return x

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
        width = self.in_width if kind == RECV_ACT else self.out_width
        return np.empty((self.rows[m], width), np.float32)

    def _forward(self, h: np.ndarray) -> list[np.ndarray]:
        acts = [h]
        for j, (w, b) in enumerate(self.layers):
            if self.kinds[j] == "row":  # partial products summed over tp, then the bias
                z = self._allreduce(acts[-1] @ w)
                z += b
            else:
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
        if self.last:
            return None
        self.pp_bytes += acts[-1].nbytes
        return acts[-1]

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
            if not j and self.first:
                return None
            dz = dz @ self.layers[j][0].T
            if self.kinds[j] == "column":  # the input's gradient: partial sums over tp
                self._allreduce(dz)
            if not j:
                self.pp_bytes += dz.nbytes
                return dz
            dz *= acts[j] > 0
        return None

    def logits(self, h: np.ndarray) -> np.ndarray:
        """The stage's output on ``h`` (no bookkeeping; the last stage's are logits)."""
        return self._forward(h)[-1]


class Pipelined:
    """What :class:`~collectives.sgd.driver.Trainer` does otherwise with the model on a
    ``dp x pp x tp`` mesh (module docstring): its own set-up, step, evaluation and summary; the
    loop is the driver's (``driver.PipelinedTrainer`` puts the two together)."""

    def __init__(self, cfg, ds, comm: MPI.Comm) -> None:
        a = self.args = cfg.args
        self.cfg, self.ds, self.comm = cfg, ds, comm
        self.world, self.rank = comm.size, comm.rank
        self.sizes = (ds.features, *cfg.hidden, ds.classes)
        self.replicas = cfg.mesh[0]
        self.spe = data.steps_per_epoch(len(ds.y_train), self.replicas, a.batch_size)
        self.total = a.epochs * self.spe
        # --codec: this rank's state (private seeds by its rank in the job), for the dp exchange
        self.state = self.compression()
        self.mesh = Mesh(cfg.mesh, names=MESH_AXES, comm=comm)
        S = self.mesh.size("pp")
        self.replica, self.stage_index, self.tp_index = self.mesh.coords()
        self.bounds = stage_bounds(self.sizes, S, a.split)
        lo, hi = self.bounds[self.stage_index], self.bounds[self.stage_index + 1]
        self.stage = MLPStage(self.sizes, lo, hi, a.seed, self.mesh.comm("tp"), a.algorithm)
        self.model = self.stage
        #: whether this rank counts the loss (the last stage's first rank of the tp axis: the
        #: others compute the same logits)
        self.counts = self.stage.last and self.tp_index == 0
        self.microbatches = a.micro_batches or S
        self.pipe = Pipeline(a.schedule or "1f1b", self.microbatches, self.mesh.comm("pp"),
                             world=self.mesh.comm())
        self.schedule = Schedule(a.lr, a.batch_size * self.replicas,
                                 int(round(a.warmup_epochs * self.spe)), self.total)
        self.clock = Clock()
        self.step_seconds: list[float] = []
        self.exchange = sync.build(cfg, self.stage.grads, self.stage.params, self.state,
                                   self.mesh.comm("dp"), self.clock)
        self.opt = SGD(self.exchange.update_params, a.momentum, a.weight_decay)
        # a checkpoint holds every rank's own shard (parameters, momentum, counters)
        self.own_params = self.own_momentum = True
        self.saves_own = (True, True)
        self.speaks, self.job = comm.rank == 0, comm  # rank 0 prints; checkpoints gather all
        self.ledger = self.exchange.ledger  # peak memory per category (the report)
        self.ledger.track("optimizer", self.opt.velocity)
        self.ledger.probe("buffers", workspace.held_bytes)
        self.track_codec()
        self.history_keys = HISTORY_KEYS
        self.coords = None
        self.step = 0
        self.history: list[dict] = []
        self.elapsed = 0.0
        self.epoch_loss = np.zeros(3)
        self.idle_s = self.busy_s = 0.0  # the bubble's seconds and the steps' seconds
        self.wait_s = 0.0  # of which waiting for the neighbor stages' messages
        self.peak_held = 0

    # ------------------------------------------------------------------ checkpoint state
    def _counters(self) -> np.ndarray:
        st = self.stage
        return np.array([self.idle_s, self.busy_s, self.peak_held, self.wait_s, st.pp_bytes,
                         st.tp_seconds, st.tp_bytes, st.peak_bytes], np.float64)

    def capture(self) -> tuple[dict, dict, dict]:
        meta, shared, mine = super().capture()
        mine["pipeline"] = self._counters()
        return meta, shared, mine

    def expected(self) -> tuple[dict[str, checkpoint.Member], dict]:
        """Collective: every rank's own shard (its size) and compression state, the driver's
        meta."""
        sizes = self.comm.allgather(self.stage.params.size)
        stats = checkpoint.Member("<f8", self.exchange.stats.as_array().shape)
        counters = checkpoint.Member("<f8", self._counters().shape)
        members = {"meta": checkpoint.Member.text(checkpoint.META_MAX_CHARS)}
        for r, n in enumerate(sizes):
            if not self.exchange.sharded:  # --shard 1: in the ranks' own files (Trainer.own)
                members.update({f"rank{r}/params": checkpoint.Member("<f4", (n,)),
                                f"rank{r}/momentum": checkpoint.Member("<f4", (n,))})
            members.update({f"rank{r}/epoch_loss": checkpoint.Member("<f8", (3,)),
                            f"rank{r}/stats": stats,
                            f"rank{r}/pipeline": counters})
        meta = {"version": checkpoint.VERSION, "world": self.world,
                "fingerprint": self.fingerprint, "config": self.config_text,
                "total_steps": self.total, "steps_per_epoch": self.spe, "step_multiple": 1,
                "history_keys": self.history_keys}
        return self.with_state(members), meta

    def restore(self, meta: dict, shared: dict, mine: dict) -> None:
        super().restore(meta, shared, mine)
        c, st = mine["pipeline"], self.stage
        self.idle_s, self.busy_s, self.wait_s = float(c[0]), float(c[1]), float(c[3])
        self.peak_held, st.pp_bytes = int(c[2]), int(c[4])
        st.tp_seconds, st.tp_bytes, st.peak_bytes = float(c[5]), int(c[6]), int(c[7])

    def shard(self, epoch: int) -> np.ndarray:
        return data.shard(len(self.ds.y_train), self.replicas, self.replica, self.args.seed,
                          epoch)

    def _step(self, order: np.ndarray) -> None:
        a, step, st = self.args, self.step, self.stage
        i = step % self.spe
        batch = order[i * a.batch_size:(i + 1) * a.batch_size]
        st.begin(self.ds.x_train[batch] if st.first else None,
                 self.ds.y_train[batch] if st.last else None, len(batch), self.microbatches)
        self.exchange.pull(step)  # --shard 1: the step the exchange belongs to
        stats = self.pipe.step(st)
        self.clock.seconds["compute"] += stats.compute_s
        self.clock.seconds["bubble"] += stats.idle_s
        self.idle_s += stats.idle_s
        self.wait_s += stats.wait_s
        self.busy_s += stats.step_s
        self.peak_held = max(self.peak_held, stats.peak_held)
        if self.counts:
            self.epoch_loss += (st.loss_sum, st.correct, len(batch))
        self.exchange(step)  # the shard's gradient averaged over its dp group
        with self.clock.measure("compute"):
            self.opt.step(self.exchange.update_grads, self.schedule(step))
        self.exchange.average_params(step)  # --shard 1: the owners' slices gathered
        if a.check_replicas:  # every dp group's shards alike (all ranks see every group's)
            digest = hashlib.blake2b(st.params.flat.tobytes(), digest_size=8).hexdigest()
            groups: dict[tuple[int, int], set[str]] = {}
            for key, d in self.comm.allgather(((self.stage_index, self.tp_index), digest)):
                groups.setdefault(key, set()).add(d)
            bad = sorted(k for k, v in groups.items() if len(v) > 1)
            if bad:
                raise RuntimeError(f"replicas differ after step {step}: the dp groups of "
                                   f"(pp, tp) = {bad}")
        self.step += 1

    def evaluate(self) -> dict:
        """Each replica's pipeline forwards its share of the test set, stage to stage; the
        counting ranks' sums are summed over every rank."""
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
                    h = recv(np.empty((rows, st.in_width), np.float32),
                             self.stage_index - 1, tag=EVAL_TAG + k, comm=pp)
                z = st.logits(h)
                if not st.last:
                    st.pp_bytes += z.nbytes
                    send(z, self.stage_index + 1, tag=EVAL_TAG + k, comm=pp)
                    continue
                if not self.counts:
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
        flat parameters (replica 0's shards of every stage put together: the layout of
        :class:`~collectives.sgd.model.MLP`'s fusion buffer), on every rank."""
        parts = self.comm.allgather((self.replica, self.stage_index, self.tp_index,
                                     self.stage.params.flat if self.replica == 0 else None))
        shards: dict[int, list[np.ndarray]] = {}
        for _, s, _, flat in sorted(p for p in parts if p[0] == 0):
            shards.setdefault(s, []).append(flat)
        T = len(shards[0])
        kinds = plan(self.sizes) if T > 1 else ["replicated"] * (len(self.sizes) - 1)
        out = []
        for s, flats in sorted(shards.items()):
            lo, hi = self.bounds[s], self.bounds[s + 1]
            layout = FusionBuffer(stage_shapes(self.sizes, lo, hi, T), allocate=False)
            views = [[f[a:b].reshape(shape) for a, b, shape in
                      zip(layout.offsets, layout.offsets[1:], layout.shapes)] for f in flats]
            for j, kind in enumerate(kinds[lo:hi]):
                w = [v[2 * j] for v in views]
                b = [v[2 * j + 1] for v in views]
                out.append(np.concatenate(w, axis=1 if kind == "column" else 0).ravel()
                           if kind != "replicated" else w[0].ravel())
                out.append(np.concatenate(b) if kind == "column" else b[0])
        return np.concatenate(out).astype(np.float32, copy=False)

    def params_to_save(self) -> np.ndarray:
        return self._saved

    def summary(self) -> dict:
        self._saved = self.gather_params() if self.args.save_params else None
        s = super().summary()
        st = self.stage
        per = self.comm.allgather((self.stage_index, self.replica, self.idle_s, self.busy_s,
                                   self.peak_held, st.peak_bytes, None, self.wait_s,
                                   st.pp_bytes, st.tp_seconds, st.tp_bytes,
                                   self.exchange.stats.seconds, self.exchange.stats.bytes_sent))
        stages = []
        S, T = self.mesh.size("pp"), self.mesh.size("tp")
        for k in range(S):
            mine = [p for p in per if p[0] == k]
            stages.append({"layers": [self.bounds[k], self.bounds[k + 1]],
                           "params": sum(a * b + b for a, b in zip(
                               self.sizes[self.bounds[k]:self.bounds[k + 1]],
                               self.sizes[self.bounds[k] + 1:self.bounds[k + 1] + 1])),
                           "bubble": sum(p[2] for p in mine) / max(1e-12, sum(p[3] for p in mine)),
                           "peak_microbatches": max(p[4] for p in mine),
                           "peak_activation_bytes": max(p[5] for p in mine)})
        s["world"] = self.world
        s["mesh"] = {"dp": self.replicas, "pp": S, "tp": T}
        # per axis: mean seconds and bytes sent per rank, and the most bytes of one rank
        s["axes"] = {axis: {"seconds": float(np.mean([p[i] for p in per])),
                            "bytes": float(np.mean([p[j] for p in per])),
                            "bytes_max": int(max(p[j] for p in per))}
                     for axis, i, j in (("dp", 11, 12), ("pp", 7, 8), ("tp", 9, 10))}
        s["params"] = sum(x["params"] for x in stages)
        s["tensor"] = T
        s["tp_comm"] = (st.tp_seconds, st.tp_bytes)
        s["label"] += f" mesh dp={self.replicas},pp={S},tp={T}" + (
            f" {self.args.schedule} M={self.microbatches}" if S > 1 else "")
        s["pipeline"] = {"stages": S, "replicas": self.replicas, "tensor": T,
                         "schedule": self.args.schedule or "1f1b",
                         "microbatches": self.microbatches,
                         "ideal_bubble": ideal_bubble(S, self.microbatches),
                         "per_stage": stages}
        return s

    def close(self) -> None:
        self.exchange.close()
        self.pipe.close()
        self.mesh.free()
