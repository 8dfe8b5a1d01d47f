"""``ShardedOptimizer``: ZeRO stages 1 and 2 over any ``torch.optim`` optimizer.

The surface is ``torch.distributed.optim.ZeroRedundancyOptimizer``'s (``params``,
``optimizer_class``, ``**defaults``, ``step()``, ``consolidate_state_dict(to=0)``,
``state_dict()``, ``load_state_dict()``), with ``comm=`` (an MPI communicator) in place of its
``process_group`` and a ``stage=``.

How it works. The parameters are flattened into *buckets*: by parameter group and dtype, in
reverse order of registration (roughly the order backward produces gradients), each up to
``bucket_bytes``. At construction the parameters become views of their bucket's flat buffer
(``ZeroRedundancyOptimizer``'s ``parameters_as_bucket_view``), broadcast from rank 0 so that
every rank starts from the same values. Each rank owns one contiguous block of every bucket
(:mod:`._flat`: padded to ``p`` equal blocks) and keeps a master copy of it, the *shard*; the
wrapped optimizer is built over the shards only, so its state (momentum, Adam's moments) is 1/p
of an unsharded one's.

``step()``: each bucket's gradients are packed into a flat buffer and reduce-scattered
(averaged): a rank receives the averaged gradient of its own block only, the one its update
reads. Both stages run this one exchange; they differ in the gradient memory they keep
(:data:`_KEEPS_GRADS`): stage 1 leaves every ``p.grad`` in place (the full gradient memory, as
ZeRO stage 1 defines it; the values this rank's backward wrote, not averaged), stage 2 frees it
(set to None) once packed. ``average_grads=True`` (stage 1) also allgathers the averaged blocks
into ``p.grad``, as DDP leaves it (the bytes of an allreduce's second half more). The wrapped
optimizer steps on the shards; an allgather of the shards writes the updated parameters into
every rank's buffers, bitwise identical everywhere. ``overlap=True`` starts each bucket's
reduce-scatter as a non-blocking request from a post-accumulate-grad hook as soon as backward
has produced all its gradients (as DDP and Horovod overlap), and ``step()`` waits.

A parameter codec (``param_codec=``: fp16, bf16, eightbit) makes the allgather after the update
``collectives.compressed_allgather``: the shard stays the owner's full-precision master (float32
for float32 parameters), which the wrapped optimizer updates, and every rank, the owner
included, writes the decoded (rounded) shards into its buckets, so the parameters a model
computes with are bitwise the same everywhere and differ from the masters by the codec's
rounding (as ``collectives.parallel.zero`` does for the NumPy driver). The buckets start as the
decoded masters too. No memory is added: the shard is a copy of its own with or without a
codec. The consolidated state dict carries the masters (``"master"``), so that a resumed run
continues bit for bit.

Cost per step, both stages: the bytes of one allreduce (the gradients' reduce-scatter + the
parameters' allgather), as DeepSpeed's stage 1 since "ZeRO stage 1 with reduced communication"
(2020; an allreduce of the gradients, then the allgather: 1.5x), plus with
``average_grads=True`` an allgather of the gradients (1.5x again, ``ZeroRedundancyOptimizer``
+ DDP's volume); the wrapped optimizer's work divided by ``p``.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from mpi4py import MPI

from .. import api as _api
from ..compressed.shard import compressed_allgather
from ._flat import FlatLayout, codec_state, param_codec_state, reduce_gradient
from .basics import default_comm

__all__ = ["ShardedOptimizer"]

MiB = 1 << 20
#: stage -> whether ``p.grad`` outlives the packing of the bucket (stage 1: the full gradient is
#: kept on every rank; stage 2: only the block, in the shard's ``.grad``)
_KEEPS_GRADS = {1: True, 2: False}


class _Bucket:
    """Parameters of one group and dtype laid end to end; this rank's block of them."""

    def __init__(self, index: int, group: int, params: list[torch.Tensor], p: int,
                 rank: int) -> None:
        self.index, self.group, self.params = index, group, params
        self.layout = FlatLayout([q.shape for q in params], p, rank)
        p0 = params[0]
        self.flat = torch.zeros(self.layout.padded, dtype=p0.dtype, device=p0.device)
        for q, v in zip(params, self.layout.views(self.flat)):
            v.copy_(q.detach())
            q.data = v  # the parameter is now a view of the bucket
        lo, hi = self.layout.lo, self.layout.hi
        self.shard = torch.nn.Parameter(self.flat[lo:hi].clone())
        self.grads: torch.Tensor | None = None  # the flat gradient, from pack() to placement
        self.ready = 0
        self.request: Any = None

    def pack(self) -> None:
        self.grads = torch.empty_like(self.flat)
        self.grads[self.layout.total:].zero_()
        for q, v in zip(self.params, self.layout.views(self.grads)):
            if q.grad is None:
                v.zero_()
            else:
                v.copy_(q.grad.detach())


def _groups(params: Any) -> list[dict]:
    if isinstance(params, torch.Tensor):
        raise TypeError("params must be an iterable of tensors or of parameter groups (dicts), "
                        "as torch.optim takes, not a single tensor")
    groups = list(params)
    if not groups:
        raise ValueError("ShardedOptimizer got an empty parameter list")
    if not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    out = []
    for g in groups:
        if not isinstance(g, dict) or "params" not in g:
            raise TypeError("parameter groups must be dicts with a 'params' entry")
        ps = g["params"]
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        for q in ps:
            if not isinstance(q, torch.Tensor) or not q.is_leaf:
                raise TypeError(f"ShardedOptimizer takes leaf tensors (parameters), got "
                                f"{type(q).__name__}")
            if q.is_sparse:
                raise TypeError("ShardedOptimizer takes dense parameters")
        out.append({**g, "params": ps})
    return out


def _elementwise(key: str, values: list, params: list[torch.Tensor]) -> bool:
    """Whether a state entry holds one value per element of its parameter (momentum, Adam's
    moments) rather than one per parameter (Adam's ``step``)."""
    if not all(torch.is_tensor(v) and v.shape == q.shape for v, q in zip(values, params)):
        return False
    return key != "step" or any(q.dim() > 0 for q in params)


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1-2 around ``optimizer_class`` (any ``torch.optim`` optimizer).

    Parameters
    ----------
    params
        Parameters or parameter groups, as ``torch.optim`` takes them. They become views of
        flat buckets, set from rank 0's values.
    optimizer_class
        The optimizer to run on this rank's shards, e.g. ``torch.optim.Adam``.
    comm
        Communicator (default :func:`collectives.torch.init`'s, else ``MPI.COMM_WORLD``).
    stage
        1: optimizer state sharded, every ``p.grad`` kept (full size); 2: ``p.grad`` freed
        too, each rank holding its block of the gradient only. Both reduce-scatter the
        gradients (a rank's update reads its block only).
    average_grads
        Stage 1: after ``step()`` every ``p.grad`` holds the averaged gradient (as DDP leaves
        it), through an allgather of the averaged blocks: 1.5x the bytes of the default, where
        ``p.grad`` keeps this rank's own gradient.
    codec
        A codec spec or codec for the gradients (an elementwise one; with error feedback where it
        needs it); None: dense.
    param_codec
        A codec spec or codec for the parameters' allgather after the update
        (:func:`collectives.compressed_allgather`: "fp16", "bf16", "eightbit:bucket=256";
        None: dense). Each rank's shard is the full-precision master the wrapped optimizer
        updates; every rank's parameters, the owner's too, are the decoded masters, bitwise
        the same everywhere. A codec that does not round each element on its own (top-k,
        signs, random or low-rank codecs) raises ``ValueError``.
    residual_dtype
        With a codec spec that has error feedback: the dtype its residuals are kept in,
        "float32", "float16" or "bfloat16" (``compress.ErrorFeedback``'s ``residual_dtype``;
        docs/sharded.md: half the memory, each step's residual rounded); None: the gradient's.
    overlap
        Start each bucket's reduce during backward from a post-accumulate-grad hook.
    bucket_bytes
        Largest bucket (a parameter larger than it is a bucket alone).
    **defaults
        The wrapped optimizer's arguments (``lr=``, ``momentum=``, ...).
    """

    def __init__(self, params: Iterable, optimizer_class: type, *, comm: Any = None,
                 stage: int = 2, codec: Any = None, residual_dtype: str | None = None,
                 param_codec: Any = None, overlap: bool = False, average_grads: bool = False,
                 bucket_bytes: int = 25 * MiB, **defaults: Any) -> None:
        if not (isinstance(optimizer_class, type)
                and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_class must be a torch.optim.Optimizer subclass, got "
                            f"{optimizer_class!r}")
        if isinstance(optimizer_class, type) and issubclass(optimizer_class, ShardedOptimizer):
            raise TypeError("optimizer_class cannot be ShardedOptimizer itself")
        if stage not in _KEEPS_GRADS or isinstance(stage, bool):
            raise ValueError(f"ShardedOptimizer runs ZeRO stage 1 or 2, got stage={stage!r} "
                             "(stage 3, parameters sharded too: collectives.torch.fully_shard)")
        if average_grads and not _KEEPS_GRADS[stage]:
            raise ValueError(f"average_grads=True goes with stage=1 (stage {stage} frees p.grad:"
                             " each rank holds its block of the gradient only)")
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be a positive integer, got {bucket_bytes!r}")
        comm = default_comm() if comm is None else comm
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"comm must be an MPI intracommunicator, got {type(comm).__name__}")
        groups = _groups(params)
        codec_st = codec_state(codec, comm.rank, "ShardedOptimizer", residual_dtype)
        param_st = None if param_codec is None else param_codec_state(
            param_codec, comm.rank, "ShardedOptimizer",
            [q.dtype for g in groups for q in g["params"] if q.requires_grad])
        super().__init__(groups, defaults)
        self._comm, self._stage, self._overlap = comm, stage, bool(overlap)
        self._average_grads = bool(average_grads)
        self._codec_state, self._param_state = codec_st, param_st
        self._step_count = 0
        p, rank = comm.size, comm.rank
        self._buckets: list[_Bucket] = []
        for gi, group in enumerate(self.param_groups):
            open_: dict[Any, list] = {}
            for q in reversed(group["params"]):
                if not q.requires_grad:  # frozen: torch.optim would never step it either
                    continue
                key = (q.dtype, q.device)
                cur = open_.setdefault(key, [])
                if cur and (sum(t.numel() * t.element_size() for t in cur)
                            + q.numel() * q.element_size() > bucket_bytes):
                    self._buckets.append(_Bucket(len(self._buckets), gi, cur, p, rank))
                    cur = open_[key] = []
                cur.append(q)
            for cur in open_.values():
                if cur:
                    self._buckets.append(_Bucket(len(self._buckets), gi, cur, p, rank))
        for b in self._buckets:  # every rank starts from rank 0's parameters
            _api.bcast(b.flat, root=0, comm=comm)
            b.shard.data.copy_(b.flat[b.layout.lo:b.layout.hi])
            if self._param_state is not None:  # ... decoded, as after every step
                self._gather(b)
        inner_groups = []
        for gi, group in enumerate(self.param_groups):
            shards = [b.shard for b in self._buckets if b.group == gi]
            inner_groups.append({**{k: v for k, v in group.items() if k != "params"},
                                 "params": shards})
        self.optim = optimizer_class(inner_groups, **defaults)
        self._bucket_of = {id(q): b for b in self._buckets for q in b.params}
        self._hooks = []
        if self._overlap:
            for b in self._buckets:
                for q in b.params:
                    if q.requires_grad:
                        self._hooks.append(q.register_post_accumulate_grad_hook(self._ready))
        self._consolidated: dict | None = None

    # -- communication --------------------------------------------------------------------------
    def _start(self, b: _Bucket, blocking: bool) -> Any:
        b.pack()
        if b.shard.grad is None:
            b.shard.grad = torch.zeros_like(b.shard)
        if not _KEEPS_GRADS[self._stage]:
            for q in b.params:  # stage 2 holds the shard's gradient only
                q.grad = None
        return reduce_gradient(b.grads, b.shard.grad, comm=self._comm,
                               state=self._codec_state, key=f"zero.b{b.index}",
                               step=self._step_count, name=f"collectives.torch.zero.b{b.index}",
                               blocking=blocking)

    def _ready(self, q: torch.Tensor) -> None:
        b = self._bucket_of[id(q)]
        b.ready += 1
        if b.ready == sum(1 for t in b.params if t.requires_grad) and b.request is None:
            b.request = self._start(b, blocking=False)

    def _reduce(self) -> None:
        """Every bucket's block of the averaged gradient in the shard's ``.grad`` (the
        reduce-scatter started here if no hook started it); with ``average_grads`` the blocks
        allgathered into ``p.grad``."""
        for b in self._buckets:
            if b.request is not None:
                b.request.wait()
            else:
                self._start(b, blocking=True)
            b.request, b.ready = None, 0
            if self._average_grads:
                _api.allgather(b.shard.grad, out=b.grads, comm=self._comm)
                for q, v in zip(b.params, b.layout.views(b.grads)):
                    if q.grad is not None:
                        q.grad.copy_(v)
            b.grads = None

    def _gather(self, b: _Bucket) -> None:
        """Every rank's bucket from the shards: dense, or with a parameter codec the decoded
        masters (the owner's block too)."""
        if self._param_state is None:
            _api.allgather(b.shard.detach(), out=b.flat, comm=self._comm)
        else:
            compressed_allgather(b.shard.detach(), self._param_state, out=b.flat,
                                 comm=self._comm, key=f"zero.params.b{b.index}")

    # -- the optimizer surface -------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Average the gradients, step the wrapped optimizer on this rank's shards, allgather
        the updated parameters. ``closure`` (re-evaluates the loss) runs first, as
        ``ZeroRedundancyOptimizer``'s."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._reduce()
        self._sync_hyperparameters()
        self.optim.step()
        for b in self._buckets:
            self._gather(b)
            b.shard.grad = None
        self._step_count += 1
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.optim.zero_grad(set_to_none)

    def _sync_hyperparameters(self) -> None:
        """Hyperparameters changed on ``param_groups`` (an LR scheduler) reach the wrapped
        optimizer."""
        for mine, inner in zip(self.param_groups, self.optim.param_groups):
            for k, v in mine.items():
                if k != "params":
                    inner[k] = v

    def add_param_group(self, param_group: dict) -> None:
        if hasattr(self, "optim"):
            raise NotImplementedError("ShardedOptimizer cannot add parameter groups after "
                                      "construction; pass every group to the constructor")
        super().add_param_group(param_group)

    # -- state dicts -----------------------------------------------------------------------------
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's shard of the optimizer state onto rank ``to`` (collective: every
        rank calls it); then ``state_dict()`` on ``to`` returns the state of an unsharded
        ``optimizer_class`` over the original parameters. With a parameter codec it also holds
        ``"master"``: each parameter's full-precision master by its index (an unsharded
        optimizer's ``load_state_dict`` ignores the entry)."""
        if not isinstance(to, int) or not 0 <= to < self._comm.size:
            raise ValueError(f"to must be a rank of the communicator (0..{self._comm.size - 1}),"
                             f" got {to!r}")
        index = {id(q): i for i, q in enumerate(q for g in self.param_groups
                                                  for q in g["params"])}
        state: dict[int, dict] = {}
        for b in self._buckets:
            inner = self.optim.state.get(b.shard, {})
            for key, value in sorted(inner.items()):
                if torch.is_tensor(value) and value.shape == b.shard.shape:
                    full = _api.allgather(value.detach().contiguous(), comm=self._comm)
                    for q, v in zip(b.params, b.layout.views(full)):
                        state.setdefault(index[id(q)], {})[key] = v.clone()
                else:
                    for q in b.params:
                        state.setdefault(index[id(q)], {})[key] = (
                            value.clone() if torch.is_tensor(value) else value)
        masters: dict[int, torch.Tensor] = {}
        if self._param_state is not None:
            for b in self._buckets:
                full = _api.allgather(b.shard.detach().contiguous(), comm=self._comm)
                for q, v in zip(b.params, b.layout.views(full)):
                    masters[index[id(q)]] = v.clone()
        groups = []
        for group in self.param_groups:
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": [index[id(q)] for q in group["params"]]})
        full_state = {"state": state, "param_groups": groups}
        if self._param_state is not None:
            full_state["master"] = masters
        self._consolidated = full_state if self._comm.rank == to else None
        self._consolidated_to = to

    def state_dict(self) -> dict:
        """The consolidated state (see :meth:`consolidate_state_dict`), on its rank only."""
        if self._consolidated is None:
            raise RuntimeError("call consolidate_state_dict(to=r) on every rank first; "
                               "state_dict() then works on rank r (ZeroRedundancyOptimizer's "
                               "rule)")
        return self._consolidated

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full state (this optimizer's consolidated one, or an unsharded
        ``optimizer_class``'s over the same parameters): each rank keeps its blocks. Its
        ``"master"`` entry, if any (a run with a parameter codec), becomes the shards, and
        the parameters their decoded values with this optimizer's parameter codec (without
        one, the masters themselves): every rank decodes every block alone, as the allgather
        does, so no message is sent."""
        if not isinstance(state_dict, dict) or "state" not in state_dict \
                or "param_groups" not in state_dict:
            raise ValueError("load_state_dict takes a full optimizer state dict ('state' and "
                             "'param_groups'), as state_dict() gives after consolidate_state_dict")
        saved_groups = state_dict["param_groups"]
        masters = state_dict.get("master")
        if len(saved_groups) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"])
                for s, g in zip(saved_groups, self.param_groups)):
            raise ValueError("the state dict's parameter groups do not match this optimizer's")
        order = [q for g in self.param_groups for q in g["params"]]
        ids = [i for s in saved_groups for i in s["params"]]
        by_param = {id(q): state_dict["state"].get(i, state_dict["state"].get(str(i)))
                    for q, i in zip(order, ids)}
        master_of = self._masters_of(masters, order, ids) if masters else None
        for mine, saved in zip(self.param_groups, saved_groups):
            for k, v in saved.items():
                if k != "params":
                    mine[k] = v
        self._sync_hyperparameters()
        self.optim.state.clear()
        for b in self._buckets:
            per = [by_param[id(q)] for q in b.params]
            if all(s is None for s in per):
                continue
            keys = set().union(*(s.keys() for s in per if s))
            st: dict[str, Any] = {}
            for key in sorted(keys):
                values = [s[key] for s in per]
                if _elementwise(key, values, b.params):
                    full = torch.zeros(b.layout.padded, dtype=values[0].dtype,
                                       device=b.flat.device)
                    for v, slot in zip(values, b.layout.views(full)):
                        slot.copy_(v)
                    st[key] = full[b.layout.lo:b.layout.hi].clone()
                else:
                    v = values[0]
                    st[key] = v.clone() if torch.is_tensor(v) else v
            self.optim.state[b.shard] = st
        if master_of is not None:
            self._load_masters(master_of)
        self._consolidated = None

    def _masters_of(self, masters: dict, order: list[torch.Tensor],
                    ids: list) -> dict[int, torch.Tensor]:
        """The state dict's masters by parameter, checked before anything is loaded."""
        by_param = {id(q): masters.get(i, masters.get(str(i))) for q, i in zip(order, ids)}
        for b in self._buckets:
            for q in b.params:
                m = by_param[id(q)]
                if not torch.is_tensor(m) or m.shape != q.shape:
                    raise ValueError(f"load_state_dict: the state dict's 'master' entry has "
                                     f"no tensor of shape {tuple(q.shape)} for a parameter "
                                     f"of bucket {b.index}")
        return by_param

    @torch.no_grad()
    def _load_masters(self, by_param: dict[int, torch.Tensor]) -> None:
        """The shards become the masters' blocks; the buckets their decoded values."""
        for b in self._buckets:
            per = [by_param[id(q)] for q in b.params]
            full = torch.zeros_like(b.flat)
            for m, slot in zip(per, b.layout.views(full)):
                slot.copy_(m)
            b.shard.copy_(full[b.layout.lo:b.layout.hi])
            if self._param_state is None:
                b.flat.copy_(full)
                continue
            chunk = b.layout.chunk
            for r in range(b.layout.p):  # each block encoded alone, as its owner sends it
                block = slice(r * chunk, (r + 1) * chunk)
                compressed_allgather(full[block], self._param_state, out=b.flat[block],
                                     comm=MPI.COMM_SELF, key=f"zero.params.b{b.index}")

    def __repr__(self) -> str:
        return (f"ShardedOptimizer(stage={self._stage}, buckets={len(self._buckets)}, "
                f"ranks={self._comm.size}, optimizer={self.optim!r})")
