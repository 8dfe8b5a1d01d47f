"""Command line of ``python -m collectives.sgd``: the parser and the checks every rank runs.

Every rank parses the same arguments and runs the same checks before any message is sent, so all
ranks reach the same verdict: a bad argument stops every rank with exit code 2
(:class:`UsageError`), never a hang or a traceback, and rank 0 alone prints the one line
``collectives.sgd: error: ...`` (and ``--help``): :mod:`collectives._runtime.cli`.
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass

import collectives
import compress

from .._runtime.cli import PLOT_INSTALL, Parser, UsageError

from . import datasets
from ..compressed.auto import split_spec
from . import sync, tensor_parallel
from .model import MODELS
from .pipelined import MESH_AXES
from ..parallel import STAGES
from ..parallel.pipeline import SCHEDULES

__all__ = ["UsageError", "Config", "parser", "parse"]

PROG = "collectives.sgd"
#: Coordinates the consensus distance is estimated from by default (``--consensus-coords``).
CONSENSUS_COORDS = 1 << 16
_STRATEGIES = ["auto", *collectives.STRATEGIES]


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


def _non_negative(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return v


def _hidden(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated widths, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"widths must be positive integers, got {text!r}")
    return sizes


def parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Data-parallel SGD of a NumPy MLP, gradients averaged "
                "with the collectives' allreduce (optionally compressed).")
    m = p.add_argument_group("model and data")
    m.add_argument("--dataset", choices=list(datasets.DATASETS), default="digits")
    m.add_argument("--model", choices=list(MODELS), default="mlp",
                   help="hidden widths: " + "; ".join(f"{k}={v}" for k, v in MODELS.items()))
    m.add_argument("--hidden", type=_hidden, help="hidden widths, e.g. 4096,4096 (overrides --model)")
    m.add_argument("--subset", type=_positive, help="use only the first N training samples")
    o = p.add_argument_group("optimisation")
    o.add_argument("--epochs", type=_positive, default=30)
    o.add_argument("--batch-size", type=_positive, default=32, help="per rank (default 32)")
    o.add_argument("--lr", type=float, default=0.1,
                   help="base learning rate per 256 samples: peak = lr * global_batch / 256")
    o.add_argument("--momentum", type=float, default=0.9)
    o.add_argument("--weight-decay", type=float, default=0.0)
    o.add_argument("--warmup-epochs", type=float, default=1.0)
    o.add_argument("--seed", type=int, default=0)
    c = p.add_argument_group("communication")
    c.add_argument("--algorithm", choices=list(collectives.ALGORITHMS), default="ring",
                   help="dense allreduce (default ring: every byte it sends is counted)")
    c.add_argument("--codec", default="none", help="NAME[:k=v,...], e.g. topk:ratio=0.01, or "
                   "auto:NAME[:k=v,...] (compress only where the cost model predicts it pays); "
                   "'none' = dense allreduce. Codecs: " + ", ".join(compress.CODECS))
    c.add_argument("--error-feedback", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the codec in error feedback (default: if the codec needs it)")
    c.add_argument("--residual-dtype", choices=("float32", "float16", "bfloat16"),
                   help="with error feedback: the dtype its residuals are kept in (default: the "
                        "gradient's, float32); float16/bfloat16 halve their memory, rounding "
                        "each step's residual (docs/sharded.md)")
    c.add_argument("--momentum-correction", action="store_true",
                   help="DGC's momentum correction and factor masking (compress.DGCMemory) in "
                        "place of error feedback: --momentum is applied before compression and "
                        "the optimizer runs plain SGD")
    c.add_argument("--sparsity-warmup", type=_non_negative, default=0, metavar="EPOCHS",
                   help="with --momentum-correction and a dgc or topk codec: DGC's warm-up, "
                        "densities 25%%, 6.25%%, 1.56%%, 0.39%% for one epoch each over the "
                        "first EPOCHS epochs (4 in the paper), then the codec's own")
    c.add_argument("--clip", type=float, metavar="NORM",
                   help="with --momentum-correction: DGC's local gradient clipping, every "
                        "rank's gradient to an L2 norm of at most NORM / sqrt(ranks)")
    c.add_argument("--dense-steps", type=_non_negative, default=0, metavar="N",
                   help="with --codec: the first N steps exchange dense gradients (PyTorch's "
                        "start_powerSGD_iter); the memory starts at step N")
    c.add_argument("--strategy", choices=_STRATEGIES, default="auto")
    c.add_argument("--sync", default="sync", help=sync.help_text())
    c.add_argument("--gamma", type=float, default=0.1,
                   help="with --sync gossip:GRAPH and --codec: CHOCO-SGD's consensus step size "
                        "in (0, 1] (default 0.1; the more the codec drops, the smaller it must "
                        "be: docs/decentralized.md)")
    c.add_argument("--overlap", action="store_true",
                   help="start each gradient bucket's allreduce (compressed with --codec) "
                        "during backward, through the progress engine; with --sync "
                        "gossip:GRAPH, mix the parameters with the neighbors' during forward "
                        "and backward (D-PSGD as Lian et al. 2017 state it)")
    c.add_argument("--gossip-dtype", choices=("float32", "float16"), default="float32",
                   help="with --sync gossip:GRAPH: the dtype the parameters travel in; float16 "
                        "halves the bytes (each rank keeps its own in float32 and adds the "
                        "neighbors' float16 weighted sum to its own part)")
    c.add_argument("--bucket-mb", type=float, default=25.0,
                   help="with --overlap: largest bucket in MiB (default 25, as PyTorch DDP); "
                        "with --shard: largest gradient bucket of the reduce-scatter")
    par = p.add_argument_group("parallelism")
    par.add_argument("--pipeline", type=_positive, metavar="S",
                     help="cut the model's layers into S pipeline stages (balanced by parameter "
                          "count, or --split), one rank each; the world size must divide by S, "
                          "and the W/S pipelines average their stages' gradients "
                          "(docs/pipeline.md)")
    par.add_argument("--micro-batches", type=_positive, metavar="M",
                     help="with a pipeline: micro-batches per batch, at least S (default S; "
                          "the bubble is (S-1)/(M+S-1))")
    par.add_argument("--schedule", choices=list(SCHEDULES), default=None,
                     help="with a pipeline: gpipe (every forward, then every backward; holds M "
                          "micro-batches) or 1f1b (the default; holds at most S)")
    par.add_argument("--split", type=_hidden, metavar="N,N,...",
                     help="with a pipeline: layers per stage, e.g. 4,4,9 (default: balanced)")
    par.add_argument("--tensor", type=_positive, metavar="T",
                     help="tensor parallelism: split each pair of hidden layers Megatron-style "
                          "(columns, then rows) over T ranks; the world / T replicas train as "
                          "data parallelism does (docs/parallelism.md)")
    par.add_argument("--mesh", type=_mesh, metavar="dp=A,pp=B,tp=C",
                     help="hybrid parallelism: the ranks as a dp x pp x tp mesh (an axis left "
                          "out is 1; the product is the world size): pipeline stages along pp "
                          "whose hidden-layer pairs are split Megatron-style along tp, the dp "
                          "replicas averaging each shard's gradient (docs/parallelism.md); "
                          "--pipeline S and --tensor T are its shorthands pp=S and tp=T")
    par.add_argument("--shard", type=int, choices=sorted(STAGES),
                     help="sharded data parallelism, ZeRO stage 1 (optimizer state sharded over "
                          "the ranks), 2 (and gradients) or 3 (and parameters); docs/sharded.md")
    par.add_argument("--param-codec", metavar="SPEC",
                     help="with --shard: compress the parameters' allgathers (bf16, fp16, "
                          "eightbit:bucket=256); every rank computes with the same decoded "
                          "parameters, owners keep full-precision masters of their shards")
    s = p.add_argument_group("output and checkpoints")
    s.add_argument("--log", help="per-epoch log, .csv or .json")
    s.add_argument("--plot", help="PNG of the training curves")
    s.add_argument("--save-params", help="write the final parameters (.npy) here")
    s.add_argument("--eval-model", choices=("own", "average"), default="own",
                   help="under --sync gossip, sgp and adpsgd, whose replicas differ: test each "
                        "rank's own replica on its share of the test set (default) or the "
                        "replicas' average, which the consensus distance computes anyway")
    s.add_argument("--consensus-coords", type=_non_negative, default=CONSENSUS_COORDS,
                   metavar="K",
                   help="where every rank keeps its own parameters: estimate the consensus "
                        "distance from K coordinates, the same on every rank (drawn once from "
                        f"--seed; an allreduce of K values; default {CONSENSUS_COORDS}), or 0: "
                        "from all of them (an allreduce of every parameter)")
    s.add_argument("--checkpoint-dir")
    s.add_argument("--checkpoint-every", type=_non_negative, default=0, help="steps (0: never)")
    s.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    s.add_argument("--stop-after", type=_positive, help="stop after this step (simulates a kill)")
    s.add_argument("--check-replicas", action="store_true",
                   help="test mode: allgather a hash of the parameters after every step")
    s.add_argument("--timeline", metavar="FILE",
                   help="write a timeline of every rank's steps and collectives (Chrome trace "
                        "JSON for Perfetto; docs/timeline.md)")
    s.add_argument("--quiet", action="store_true", help="no progress bar or epoch lines")
    return p


def _mesh(text: str) -> dict[str, int]:
    """``--mesh dp=A,pp=B,tp=C`` -> ``{"dp": A, ...}`` (the axes given; each at most once)."""
    sizes: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        name, eq, value = part.partition("=")
        if not eq or name not in MESH_AXES or name in sizes or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"expected AXIS=N,... with each of {', '.join(MESH_AXES)} at most once and N a "
                f"positive integer, got {text!r}")
        sizes[name] = _positive(value)
    return sizes


def _mesh_shape(a: argparse.Namespace, world: int) -> tuple[tuple[int, int, int] | None, str]:
    """The run's ``(dp, pp, tp)`` mesh and the flag that gave it (None: plain data
    parallelism): ``--mesh`` as given (axes left out are 1), or the shorthands ``--pipeline S``
    (``pp = S``) and ``--tensor T`` (``tp = T``), ``dp`` the rest of the world."""
    if a.mesh is not None:
        if a.pipeline or a.tensor:
            raise UsageError("--mesh gives the whole dp x pp x tp shape; --pipeline S and "
                             "--tensor T are shorthands of it (pp=S, tp=T): give one or the "
                             "other")
        shape = tuple(a.mesh.get(axis, 1) for axis in MESH_AXES)
        if shape[0] * shape[1] * shape[2] != world:
            raise UsageError(f"--mesh {','.join(f'{k}={v}' for k, v in zip(MESH_AXES, shape))}"
                             f" holds {shape[0] * shape[1] * shape[2]} ranks, the world size is "
                             f"{world}: dp x pp x tp must equal it (an axis left out is 1)")
        return shape, "--mesh"
    if not (a.pipeline or a.tensor):
        return None, ""
    S, T = a.pipeline or 1, a.tensor or 1
    flag = " and ".join(f for f, v in (("--pipeline", a.pipeline), ("--tensor", a.tensor)) if v)
    if world % (S * T):
        raise UsageError(
            f"--pipeline {S} must divide the world size {world} (W/S data-parallel pipelines)"
            if not a.tensor else
            f"--tensor {T} does not divide the world size {world}: the ranks form a dp x tp "
            f"mesh of {world} / {T} x {T}" if not a.pipeline else
            f"--pipeline {S} x --tensor {T} = {S * T} must divide the world size {world} (a "
            f"dp x pp x tp mesh)")
    return (world // (S * T), S, T), flag


def _check_mesh(a: argparse.Namespace, shape: tuple[int, int, int], flag: str,
                hidden: tuple[int, ...]) -> str | None:
    """What is wrong with the mesh and the pipeline flags (None: nothing); fills in their
    defaults."""
    S, T = shape[1], shape[2]
    layers = len(hidden) + 1
    a.schedule = a.schedule or "1f1b"
    a.micro_batches = a.micro_batches or S
    if S > layers:
        return (f"{flag}: {S} pipeline stages, but the model has {layers} layers, and every "
                "stage needs at least one")
    if T > 1:
        problem = tensor_parallel.check(hidden, T, "--tensor" if a.tensor else "--mesh tp=")
        if problem:
            return problem
    if a.split is not None and (len(a.split) != S or sum(a.split) != layers):
        return (f"--split {','.join(map(str, a.split))} must list {S} stages' layer counts "
                f"adding up to the model's {layers} layers")
    if a.micro_batches < S:
        return (f"--micro-batches {a.micro_batches} is below the {S} stages of the pipeline: "
                "give at least S (the bubble is (S-1)/(M+S-1))")
    if a.micro_batches > a.batch_size:
        return f"--micro-batches {a.micro_batches} exceeds the --batch-size {a.batch_size}"
    if a.shard and a.shard > 1:
        return (f"--shard {a.shard} on a mesh ({flag}): ZeRO stages 2 and 3 reduce-scatter each "
                "gradient block as backward writes it, where the stages add every "
                "micro-batch's gradient into the whole gradient first, and split layers hold "
                "shards of their own; --shard 1 (the optimizer state sharded within each dp "
                "group) composes with a mesh")
    others = [f for f, v in (("--sync " + a.sync, a.sync != "sync"),
                             ("--momentum-correction", a.momentum_correction),
                             ("--overlap", a.overlap), ("--timeline", a.timeline and S > 1))
              if v]
    if others:
        return (f"{flag} does not take {', '.join(others)}: a run on a dp x pp x tp mesh "
                "averages its shards' gradients over dp every step, after the pipeline, "
                "dense or compressed by --codec (docs/parallelism.md)")
    return None


@dataclass(frozen=True)
class Config:
    """Checked settings of one run."""

    args: argparse.Namespace
    hidden: tuple[int, ...]
    local_every: int
    codec_name: str | None
    #: the graph's name of ``--sync gossip:GRAPH``, else None
    gossip: str | None = None
    #: ``--sync gossip:GRAPH --codec SPEC``: the codec spec of CHOCO-SGD's gossip, else None
    choco: str | None = None
    #: the sync mode's class (:data:`collectives.sgd.sync.MODES`)
    mode: type[sync.SyncMode] = sync.Synchronous
    #: ``(dp, pp, tp)`` of ``--mesh`` (or ``--pipeline``, ``--tensor``), else None
    mesh: tuple[int, int, int] | None = None

    def fingerprint_fields(self) -> dict:
        """What fixes the trajectory (a checkpoint must match it to be resumed)."""
        a = self.args
        fields = {"dataset": a.dataset, "subset": a.subset, "hidden": list(self.hidden),
                  "epochs": a.epochs, "batch": a.batch_size, "lr": a.lr, "momentum": a.momentum,
                  "wd": a.weight_decay, "warmup": a.warmup_epochs, "seed": a.seed,
                  "algorithm": a.algorithm, "codec": a.codec, "ef": a.error_feedback,
                  "strategy": a.strategy, "sync": a.sync}
        if a.dense_steps:
            fields["dense_steps"] = a.dense_steps
        if self.mesh:  # the micro-batches fix the order of the gradient's sum (not the
            # schedule); tp, the order of the row layers' sums
            fields.update(mesh=list(self.mesh), micro_batches=a.micro_batches,
                          split=list(a.split) if a.split else None)
        if a.momentum_correction:  # DGC as published: other state, other trajectory
            fields.update(momentum_correction=True, sparsity_warmup=a.sparsity_warmup,
                          clip=a.clip)
        if self.choco:
            fields["gamma"] = a.gamma
        if a.gossip_dtype != "float32":
            fields["gossip_dtype"] = a.gossip_dtype
        if a.shard:
            fields["shard"] = a.shard
        if a.param_codec:
            fields["param_codec"] = a.param_codec
        if a.residual_dtype:
            fields["residual_dtype"] = a.residual_dtype
        if a.overlap and self.gossip is not None:  # mixing x_t, not x_t's update: another run
            fields["overlap"] = True
        elif a.overlap:  # buckets reduce in other pieces than one fused buffer: other bits
            fields["overlap_bucket_mb"] = a.bucket_mb
        return fields


def parse(argv: list[str] | None, world: int, n_train: int) -> Config:
    """Parse ``argv`` and check it against the world size and data; raises UsageError."""
    a = parser().parse_args(argv)
    try:
        mode, value = sync.parse(a.sync, world)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if a.shard:
        if mode is not sync.Synchronous:
            raise UsageError(f"--shard {a.shard} shards synchronous data parallelism (gradients "
                             f"averaged every step): it does not compose with --sync {a.sync}")
        mode, value = sync.Sharded, a.shard
    try:
        inner = split_spec(a.codec)  # "auto:<spec>": the codec where it pays, else dense
        name, params = compress.parse_spec(a.codec if inner is None else inner)
        compress.registry.check_params(name, params)  # also: unknown codec name
        if not isinstance(params.get("seed", 0), int) or isinstance(params.get("seed"), bool):
            raise ValueError(f"{name} parameter 'seed' takes an integer, got {params['seed']!r}")
    except ValueError as e:
        raise UsageError(f"--codec {a.codec}: {e}") from None
    codec_name = None if name == "none" and a.codec == "none" else name
    # a mode may compress its own rounds with the codec (CHOCO-SGD), not the gradients
    choco = mode.mixing_codec(a, value, inner) if codec_name else None
    if choco:
        codec_name = None
    for refusal in sync.refusals(mode, value, choco):
        message = refusal.check(a, codec_name)
        if message:
            raise UsageError(message)
    local_every = mode.every(value)
    if a.param_codec and not a.shard:
        raise UsageError("--param-codec compresses a sharded run's parameter allgathers: "
                         "it needs --shard 1, 2 or 3")
    shape, flag = _mesh_shape(a, world)
    if shape is None:
        given = [f for f, v in (("--micro-batches", a.micro_batches),
                                ("--schedule", a.schedule), ("--split", a.split)) if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} need --pipeline S or --mesh pp=S (a "
                             "pipeline)")
    else:
        world = shape[0]  # the data is split over the dp replicas
    n = min(n_train, a.subset or n_train)
    if world > n:
        raise UsageError(f"world size {world} exceeds the {n} training samples")
    if (n // world) < a.batch_size:
        raise UsageError(f"--batch-size {a.batch_size} exceeds the {n // world} training "
                         f"samples of each of the {world} "
                         f"{'replicas' if shape else 'ranks'}")
    if not 0 <= a.momentum < 1 or a.lr <= 0 or a.warmup_epochs < 0 or a.weight_decay < 0:
        raise UsageError("need --lr > 0, 0 <= --momentum < 1, --warmup-epochs >= 0, "
                         "--weight-decay >= 0")
    if (a.resume or a.checkpoint_every) and not a.checkpoint_dir:
        raise UsageError("--resume and --checkpoint-every need --checkpoint-dir")
    message = mode.check(a, value)  # what else the mode cannot run with
    if message:
        raise UsageError(message)
    if not a.bucket_mb > 0:
        raise UsageError(f"--bucket-mb must be positive, got {a.bucket_mb}")
    if codec_name is None and (a.error_feedback or a.strategy != "auto"
                               or a.momentum_correction or a.dense_steps):
        raise UsageError("--error-feedback, --momentum-correction, --dense-steps and --strategy "
                         "need a --codec")
    if a.residual_dtype and (codec_name is None or a.momentum_correction
                             or not (a.error_feedback if a.error_feedback is not None
                                     else compress.CODECS[name].needs_error_feedback)):
        raise UsageError("--residual-dtype sets the dtype of error feedback's residuals: it "
                         "needs a --codec with error feedback (--error-feedback)")
    if a.momentum_correction and a.error_feedback:
        raise UsageError("--momentum-correction replaces --error-feedback (it keeps what was "
                         "not sent in the velocity): give one of them")
    if (a.sparsity_warmup or a.clip is not None) and not a.momentum_correction:
        raise UsageError("--sparsity-warmup and --clip are options of --momentum-correction")
    if a.sparsity_warmup and name not in ("dgc", "topk"):
        raise UsageError(f"--sparsity-warmup needs a dgc or topk codec, got {name!r}")
    if a.clip is not None and not 0 < a.clip < float("inf"):
        raise UsageError(f"--clip must be a positive L2 norm, got {a.clip}")
    message = _check_mesh(a, shape, flag, a.hidden or MODELS[a.model]) if shape else None
    if message:
        raise UsageError(message)
    for path, exts in ((a.log, (".csv", ".json")), (a.plot, (".png",))):
        if path and not path.lower().endswith(exts):
            raise UsageError(f"{path}: expected a file ending in {' or '.join(exts)}")
    if a.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"--plot needs matplotlib: {PLOT_INSTALL}")
    return Config(a, a.hidden or MODELS[a.model], local_every, codec_name,
                  value.name if mode is sync.Gossip else None, choco, mode, shape)
