"""Horovod's helpers: broadcast a model's state and an optimizer's state; a compressed allreduce.

``broadcast_parameters`` sends each tensor of a ``state_dict`` (parameters and buffers) from the
root with :func:`collectives.bcast` (binomial tree, pipelined): ``log2 p`` rounds per tensor.
``broadcast_optimizer_state`` sends the root optimizer's ``state_dict`` (hyperparameters and
per-parameter state) as one pickled object and loads it everywhere, so ranks whose optimizer has
no state yet (before the first step) get the root's too; a ``DistributedOptimizer`` keeps its own
codec state (error-feedback residuals are per rank).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .. import api
from ..compressed.api import compressed_allreduce
from ._common import make_state
from .basics import default_comm

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "compressed_allreduce_"]


def _tensors(params: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, Mapping):
        items = list(params.items())
    else:
        items = list(params)
        if items and isinstance(items[0], torch.Tensor):
            items = [(str(i), t) for i, t in enumerate(items)]
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name!r} is a {type(t).__name__}, not a tensor")
    return items


def broadcast_parameters(params: Any, root: int = 0, comm: Any = None, *,
                         root_rank: int | None = None) -> None:
    """Copy the root's tensors into every rank's, in place (``root_rank``: Horovod's name for
    ``root``).

    ``params``: ``model.state_dict()``, ``model.named_parameters()``, or a list of tensors, in
    the same order on every rank.
    """
    comm = default_comm() if comm is None else comm
    root = root if root_rank is None else root_rank
    for _, t in _tensors(params):
        with torch.no_grad():
            if t.is_contiguous():
                api.bcast(t.detach(), root=root, comm=comm)
            else:
                buf = t.detach().contiguous()
                api.bcast(buf, root=root, comm=comm)
                t.copy_(buf)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root: int = 0,
                              comm: Any = None, *, root_rank: int | None = None) -> None:
    """Give every rank's ``optimizer`` the root's state (hyperparameters, momentum buffers...);
    ``root_rank``: Horovod's name for ``root``."""
    comm = default_comm() if comm is None else comm
    root = root if root_rank is None else root_rank
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    mine = optimizer.state_dict()
    own_codec = mine.pop("collectives", None)
    state = comm.bcast(mine if comm.rank == root else None, root=root)
    if own_codec is not None:
        state["collectives"] = own_codec
    optimizer.load_state_dict(state)


def compressed_allreduce_(tensor: torch.Tensor, *, op: str = "avg", algorithm: str = "auto",
                          codec: Any = None, error_feedback: bool | None = None,
                          strategy: str = "auto", key: Any = None, comm: Any = None) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks of ``comm`` in place (outside autograd), with
    ``algorithm`` or compressed with ``codec``; returns it. The path of
    :func:`collectives.torch.allreduce` with ``codec=``/``compression=``/``algorithm=``.

    ``codec``: a spec, a codec or a ``CompressionState`` (pass the same state object at every
    call for error feedback); the compressed call's ``key`` names the tensor's codec state.
    """
    comm = default_comm() if comm is None else comm
    buf = tensor.detach()
    if codec is None:
        api.allreduce(buf, out=buf, op=op, algorithm=algorithm, comm=comm)
    else:
        compressed_allreduce(buf, make_state(codec, error_feedback, rank=comm.rank), out=buf, op=op,
                             strategy=strategy, key=key, algorithm=algorithm, comm=comm)
    return tensor
