"""``fully_shard``: ZeRO stage 3 in the shape of FSDP2's ``torch.distributed.fsdp.fully_shard``.

Apply it to each block of a model, then to the root (``for layer in model: fully_shard(layer)``;
``fully_shard(model)``). Each call makes a *unit* of the module's parameters that no inner unit
holds yet: they are flattened, one flat buffer per dtype (:mod:`._flat`: padded to ``p`` equal
blocks), and each rank keeps its block only, as a ``torch.nn.Parameter`` registered on the
module (``_flat_param_<dtype>``) in place of the original parameters. The optimizer is built over
``model.parameters()`` after sharding, which are these shards (as FSDP2).

How a step runs. A forward pre-hook allgathers the unit's flat parameters into its full buffer
and puts views of it where the original parameters were (``layer.weight`` is a plain tensor
during forward); a custom autograd function (:class:`_Unshard`) ties the full buffer to the shard
in the autograd graph. A forward post-hook frees the buffer's storage (``resize_(0)``: the
tensors autograd saved keep their storage object, now empty) and hooks the module's outputs:
when backward reaches them, the unit gathers again into the same storage before the module's own
backward reads its saved weights. When backward has produced the gradient of every view,
:meth:`_Unshard.backward` reduce-scatters (averages) the full gradient into the shard's
``.grad`` and frees the buffer again. With ``prefetch=True`` the next unit's allgather (the
previous one's in backward, in the order the first forward ran them) starts as a non-blocking
request while this unit computes.

Memory held between steps: 1/p of parameters, gradients and optimizer state, plus during a
module's forward and backward that unit's full parameters (and the prefetched one's).
Communication per step: two allgathers and one reduce-scatter of every unit (1.5x an allreduce's
bytes).

State dicts: ``module.state_dict()`` is the sharded one (each rank its blocks);
:func:`full_state_dict` gathers the original parameters under their original names, loadable
into the unwrapped module (FSDP2's ``get_model_state_dict(..., full_state_dict=True)``), and
:func:`load_full_state_dict` takes such a dict back into the shards.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from mpi4py import MPI
from torch.utils._pytree import tree_flatten

from .. import api as _api
from ..engine import nonblocking
from ..compressed.shard import compressed_allgather
from ._flat import FlatLayout, codec_state, param_codec_state, reduce_gradient
from .basics import default_comm

__all__ = ["fully_shard", "full_state_dict", "load_full_state_dict"]

_UNIT = "_collectives_fully_shard"
_SERIALS = itertools.count()


class _FlatParam:
    """One dtype's parameters of a unit: where they lived, their layout, the shard, the full
    buffer (storage freed outside forward and backward) and a pending prefetch."""

    def __init__(self, unit: "_Unit", places: list[tuple[torch.nn.Module, str, str]],
                 tensors: list[torch.Tensor], p: int, rank: int) -> None:
        self.unit = unit
        self.places = places  # (owning module, attribute name, name under the unit's module)
        # the compressed allgather's key (a param_codec's state, if it keeps any, by tensor)
        self.key = f"fsdp.params.{unit.serial}.{len(unit.flats)}"
        self.layout = FlatLayout([t.shape for t in tensors], p, rank)
        t0 = tensors[0]
        full = torch.zeros(self.layout.padded, dtype=t0.dtype, device=t0.device)
        for t, v in zip(tensors, self.layout.views(full)):
            v.copy_(t.detach())
        self.shard = torch.nn.Parameter(full[self.layout.lo:self.layout.hi].clone(),
                                        requires_grad=any(t.requires_grad for t in tensors))
        self.full = full
        self.nbytes = full.untyped_storage().nbytes()
        self.gathered = False
        self.request: Any = None
        self.free()

    def free(self) -> None:
        if self.request is not None:
            self.request.wait()
            self.request = None
        self.full.untyped_storage().resize_(0)
        self.gathered = False

    def _alloc(self) -> None:
        if self.full.untyped_storage().nbytes() == 0:
            self.full.untyped_storage().resize_(self.nbytes)

    def prefetch(self) -> None:
        if self.gathered or self.request is not None:
            return
        self._alloc()
        unit = self.unit
        if unit.param_state is None:
            self.request = nonblocking.iallgather(self.shard.detach(), out=self.full,
                                                  comm=unit.comm)
        else:  # every rank, the owner too, computes with the decoded (quantized) parameters
            self.request = nonblocking.icompressed_allgather(
                self.shard.detach(), unit.param_state, out=self.full, comm=unit.comm,
                key=self.key)

    def gather(self) -> None:
        if self.request is not None:
            self.request.wait()
            self.request = None
        elif not self.gathered:
            self._alloc()
            unit = self.unit
            if unit.param_state is None:
                _api.allgather(self.shard.detach(), out=self.full, comm=unit.comm)
            else:
                compressed_allgather(self.shard.detach(), unit.param_state, out=self.full,
                                     comm=unit.comm, key=self.key)
        self.gathered = True

    def place(self, full: torch.Tensor) -> None:
        """Put views of ``full`` where the original parameters were."""
        for (mod, attr, _), v in zip(self.places, self.layout.views(full)):
            setattr(mod, attr, v)


class _Unshard(torch.autograd.Function):
    """``shard -> full buffer`` in the graph: forward returns the gathered buffer (gathered by
    the pre-forward hook); backward reduce-scatters the buffer's gradient into the shard's."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, flat: _FlatParam) -> torch.Tensor:
        ctx.flat = flat
        return flat.full.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        flat: _FlatParam = ctx.flat
        unit = flat.unit
        out = torch.empty_like(flat.shard)
        reduce_gradient(grad.contiguous(), out, comm=unit.comm,
                        state=unit.codec_state, key=f"fsdp.{unit.index}.{flat.shard.dtype}",
                        step=unit.steps(), blocking=True)
        flat.free()
        return out, None


class _Unit:
    """One ``fully_shard`` call: its flat parameters, its hooks, its place in the order."""

    def __init__(self, module: torch.nn.Module, comm: Any, codec: Any, prefetch: bool,
                 order: list, param_state: Any = None) -> None:
        self.module, self.comm, self.prefetch_on = module, comm, prefetch
        self.serial = next(_SERIALS)  # the same on every rank: fully_shard is called alike
        self.codec_state, self.param_state = codec, param_state
        self.order = order  # shared by the units of one model: forward order of the first run
        self.index = -1
        self.flats: list[_FlatParam] = []
        self._backward_steps = 0

    def steps(self) -> int:
        self._backward_steps += 1
        return self._backward_steps - 1

    def _neighbor(self, delta: int) -> "_Unit | None":
        if self.index < 0:
            return None
        j = self.index + delta
        return self.order[j] if 0 <= j < len(self.order) else None

    def pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        if self.index < 0:
            self.index = len(self.order)
            self.order.append(self)
        for f in self.flats:
            f.gather()
        nxt = self._neighbor(+1)
        if self.prefetch_on and nxt is not None:
            for f in nxt.flats:
                f.prefetch()
        for f in self.flats:
            if torch.is_grad_enabled() and f.shard.requires_grad:
                f.place(_Unshard.apply(f.shard, f))
            else:
                f.place(f.full.detach())

    def post_forward(self, module: torch.nn.Module, args: Any, output: Any) -> Any:
        for f in self.flats:
            f.free()
        if self.flats and torch.is_grad_enabled():
            for t in tree_flatten(output)[0]:
                if torch.is_tensor(t) and t.requires_grad:
                    t.register_hook(self._pre_backward)
        return output

    def _pre_backward(self, grad: torch.Tensor) -> torch.Tensor:
        for f in self.flats:
            f.gather()
        prev = self._neighbor(-1)
        if self.prefetch_on and prev is not None:
            for f in prev.flats:
                f.prefetch()
        return grad


def fully_shard(module: torch.nn.Module, *, comm: Any = None, codec: Any = None,
                param_codec: Any = None, prefetch: bool = True,
                residual_dtype: str | None = None) -> torch.nn.Module:
    """Shard ``module``'s parameters (those no inner ``fully_shard`` holds) over the ranks of
    ``comm``; returns ``module``, changed in place (FSDP2's ``fully_shard``).

    Parameters
    ----------
    module
        An ``nn.Module``; call on the blocks first, then on the root.
    comm
        Communicator (default :func:`collectives.torch.init`'s, else ``MPI.COMM_WORLD``); every
        unit of one model must use the same one.
    codec
        Codec spec or codec for the gradients' reduce (elementwise; None: dense).
    residual_dtype
        With a codec spec that has error feedback: the dtype its residuals are kept in,
        "float32", "float16" or "bfloat16" (as :class:`ShardedOptimizer` takes it).
    param_codec
        Codec spec or codec for the parameters' allgather (:func:`collectives.compressed_allgather`:
        "fp16", "bf16", "eightbit:bucket=256"; None: dense). Each rank keeps its shard in full
        precision (the optimizer updates it) and every rank, the owner too, computes with the
        same decoded parameters, bitwise.
    prefetch
        Start the next unit's allgather while this one computes (the previous one's in
        backward).

    The parameters are taken from rank 0 (broadcast), so every rank starts the same.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"fully_shard takes a torch.nn.Module, got {type(module).__name__}")
    if getattr(module, _UNIT, None) is not None:
        raise ValueError(f"fully_shard was already applied to this {type(module).__name__}")
    comm = default_comm() if comm is None else comm
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an MPI intracommunicator, got {type(comm).__name__}")
    state = codec_state(codec, comm.rank, "fully_shard", residual_dtype)
    inner = [m for m in module.modules() if getattr(m, _UNIT, None) is not None]
    held = {id(f.shard) for m in inner for f in getattr(m, _UNIT).flats}
    named = list(module.named_parameters(remove_duplicate=False))
    own = [(n, t) for n, t in named if id(t) not in held]
    param_state = None if param_codec is None else param_codec_state(
        param_codec, comm.rank, dtypes=[t.dtype for _, t in own])
    seen: dict[int, str] = {}
    for n, t in own:
        if id(t) in seen:
            raise NotImplementedError(f"fully_shard: parameter {n!r} is shared with "
                                      f"{seen[id(t)]!r}; shared parameters are not supported")
        seen[id(t)] = n
    order: list[_Unit] = []  # the model's units in forward order, filled by the first forward
    for m in inner:
        if getattr(m, _UNIT).comm is not comm:
            raise ValueError("fully_shard: every unit of a model must use the same comm")
    unit = _Unit(module, comm, state, bool(prefetch), order, param_state)
    by_dtype: dict[Any, list[tuple[str, torch.Tensor]]] = {}
    for n, t in own:
        by_dtype.setdefault((t.dtype, t.device), []).append((n, t))
    for (dtype, _), entries in by_dtype.items():
        places = []
        tensors = []
        for n, t in entries:
            owner_name, _, attr = n.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            places.append((owner, attr, n))
            tensors.append(t)
        with torch.no_grad():
            flat_full = torch.cat([t.detach().reshape(-1) for t in tensors])
            _api.bcast(flat_full, root=0, comm=comm)
            start = 0
            for t in tensors:
                t.copy_(flat_full[start:start + t.numel()].view_as(t))
                start += t.numel()
        f = _FlatParam(unit, places, tensors, comm.size, comm.rank)
        for owner, attr, _ in places:
            del owner._parameters[attr]
        module.register_parameter(f"_flat_param_{str(dtype).removeprefix('torch.')}", f.shard)
        unit.flats.append(f)
    for m in inner:  # the outermost unit's order list is the model's
        getattr(m, _UNIT).order = order
    object.__setattr__(module, _UNIT, unit)
    module.register_forward_pre_hook(unit.pre_forward)
    module.register_forward_hook(unit.post_forward)
    return module


def _units(module: torch.nn.Module) -> list[tuple[str, _Unit]]:
    out = [(n, getattr(m, _UNIT)) for n, m in module.named_modules()
           if getattr(m, _UNIT, None) is not None]
    if not out:
        raise ValueError("full_state_dict: the module has no fully_shard unit")
    return out


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, gathered, under its original name, plus the module's buffers: a state
    dict that ``load_state_dict`` of the unwrapped module takes (collective: every rank calls
    it and gets the same tensors)."""
    out: dict[str, torch.Tensor] = {}
    for prefix, unit in _units(module):
        for f in unit.flats:
            full = _api.allgather(f.shard.detach().contiguous(), comm=unit.comm)
            for (_, _, name), v in zip(f.places, f.layout.views(full)):
                out[f"{prefix}.{name}" if prefix else name] = v.clone()
    for name, b in module.named_buffers():
        out[name] = b.detach().clone()
    return out


def load_full_state_dict(module: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Load a full state dict (:func:`full_state_dict`'s, or the unwrapped module's own) into
    the shards and buffers: each rank keeps its blocks."""
    units = _units(module)
    names = {(f"{p}.{n}" if p else n) for p, u in units for f in u.flats for _, _, n in f.places}
    missing = sorted(names - set(state_dict))
    if missing:
        raise KeyError(f"load_full_state_dict: missing {', '.join(missing[:5])}")
    with torch.no_grad():
        for prefix, unit in units:
            for f in unit.flats:
                full = torch.zeros(f.layout.padded, dtype=f.shard.dtype)
                for (_, _, name), v in zip(f.places, f.layout.views(full)):
                    v.copy_(state_dict[f"{prefix}.{name}" if prefix else name])
                f.shard.copy_(full[f.layout.lo:f.layout.hi])
        for name, b in module.named_buffers():
            if name in state_dict:
                b.copy_(state_dict[name])
