"""``DistributedNeighborAllreduceOptimizer``: decentralized SGD for PyTorch (BlueFog's name).

How it works (adapt then combine; D-PSGD, Lian et al. 2017). ``step()`` first steps the wrapped
optimizer on this rank's own gradients (nothing is averaged: every rank keeps its own replica),
then mixes the parameters with the in-neighbors' in the graph: every parameter of one dtype is
packed into one flat buffer, one :func:`collectives.neighbor_allreduce` runs over it (with the
step number, for graphs that change every step), and the buffer is unpacked into the parameters.

Cost per step: one neighbor round per dtype over all parameters (on the one-peer exponential
graph, one message of the parameters per rank, whatever the number of ranks), and two copies of
every parameter (into the buffer and back). CPU tensors of float16, float32 and float64.
"""

from __future__ import annotations

from typing import Any

import torch

import collectives

from ..decentralized.topology import Topology
from .basics import default_comm

__all__ = ["DistributedNeighborAllreduceOptimizer"]

_DTYPES = (torch.float16, torch.float32, torch.float64)


class _NeighborOptimizer:
    """Methods mixed into a subclass of the wrapped optimizer's class."""

    def __init__(self, param_groups: list[dict], topology: Topology, comm: Any,
                 self_weight: float | None, weights: dict | None) -> None:
        super(self.__class__, self).__init__(param_groups)  # the wrapped optimizer's class
        self._comm = default_comm() if comm is None else comm
        topology.check_size(self._comm.size, "DistributedNeighborAllreduceOptimizer")
        self._topology, self._self_weight, self._weights = topology, self_weight, weights
        self._rounds = 0
        params = [p for group in self.param_groups for p in group["params"]]
        for p in params:
            if p.device.type != "cpu" or p.dtype not in _DTYPES:
                raise TypeError("DistributedNeighborAllreduceOptimizer: parameters must be CPU "
                                f"tensors of float16, float32 or float64, got {p.dtype} on "
                                f"{p.device}")
        self._groups = {dtype: [p for p in params if p.dtype == dtype] for dtype in _DTYPES}
        self._buffers = {dtype: torch.empty(sum(p.numel() for p in ps), dtype=dtype)
                         for dtype, ps in self._groups.items() if ps}

    def step(self, closure=None):
        """The wrapped optimizer's step on this rank's gradients, then one neighbor round of the
        parameters (the step number makes time-varying graphs change)."""
        loss = super(self.__class__, self).step(closure)
        with torch.no_grad():
            for dtype, buf in self._buffers.items():
                params, offset = self._groups[dtype], 0
                for p in params:
                    buf[offset:offset + p.numel()].copy_(p.reshape(-1))
                    offset += p.numel()
                flat = buf.numpy()
                collectives.neighbor_allreduce(flat, self._topology, out=flat,
                                               step=self._rounds, comm=self._comm,
                                               self_weight=self._self_weight,
                                               weights=self._weights)
                offset = 0
                for p in params:
                    p.copy_(buf[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
        self._rounds += 1
        return loss

    def state_dict(self) -> dict:
        state = super(self.__class__, self).state_dict()
        state["collectives.neighbor_rounds"] = self._rounds
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        self._rounds = int(state_dict.pop("collectives.neighbor_rounds", 0))
        super(self.__class__, self).load_state_dict(state_dict)


def DistributedNeighborAllreduceOptimizer(optimizer: torch.optim.Optimizer, topology: Topology, *,
                                          self_weight: float | None = None,
                                          weights: dict[int, float] | None = None,
                                          comm: Any = None) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` for decentralized SGD: each ``step()`` steps it on this rank's own
    gradients, then averages the parameters with the in-neighbors' in ``topology`` (see the
    module).

    Parameters
    ----------
    optimizer
        A ``torch.optim`` optimizer; the result is an instance of a subclass of its class, with
        the same parameter groups and state.
    topology
        A :class:`collectives.topology.Topology` for the communicator's size (a ``ValueError``
        says otherwise), the same on every rank; doubly stochastic for D-PSGD's average.
    self_weight, weights
        Override this rank's row of the mixing matrix, as in
        :func:`collectives.neighbor_allreduce`.
    comm
        The communicator (default: :func:`collectives.torch.init`'s, else ``MPI.COMM_WORLD``).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not isinstance(topology, Topology):
        raise TypeError("topology must be a collectives.topology.Topology, got "
                        f"{type(topology).__name__}")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in _NeighborOptimizer.__dict__.items()
                if k not in ("__dict__", "__weakref__")})
    wrapped = cls(optimizer.param_groups, topology, comm, self_weight, weights)
    wrapped.load_state_dict(optimizer.state_dict())
    return wrapped
