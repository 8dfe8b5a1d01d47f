"""A DDP communication hook that gossips each gradient bucket instead of allreducing it.

``model.register_comm_hook(GossipHookState(topology.ring(p)), gossip_hook)``: DDP hands each
gradient bucket (a flat tensor) to :func:`gossip_hook`, which starts one in-place
:func:`collectives.ineighbor_allreduce` of it over the graph (rank ``i`` gets
``W[i, i] g_i + sum_j W[i, j] g_j`` over its in-neighbors ``j``, with the iteration as the step
of a time-varying graph) and returns a ``torch.futures.Future`` completed with the bucket when
the round is done (by the request's completion callback, on the engine thread, as
:func:`collectives.torch.comm_hook`'s futures). It is D-PSGD's averaging applied to the
gradients (Lian et al. 2017 mix the parameters; mixing the gradients is the variant a DDP hook
can express, since DDP owns the parameters): on ``topology.full(p)`` (``W = 11^T / p``) it is
the allreduce average, to rounding.

The replicas stay in lockstep only where every rank's mixed gradient is the same (the full
graph): on a sparser graph each rank steps on its own mix, so the parameters drift apart.
DDP broadcasts them once, at construction; re-synchronise them (or use
:func:`collectives.torch.DistributedNeighborAllreduceOptimizer`, which mixes the parameters)
where that matters.

Cost per bucket of ``n`` bytes: one neighbor round, ``d`` messages of ``n`` bytes out and in
for ``d`` neighbors (one on the one-peer exponential graph, whatever ``p``), against the ring
allreduce's ``2 n (p-1)/p`` bytes and ``2 (p-1)`` latencies.

Checks (before any message, in :class:`GossipHookState`): the topology is a
:class:`~collectives.topology.Topology` for the communicator's size; the weights (the
topology's rows, or ``self_weight``/``weights``) are checked by the neighbor allreduce itself.
"""

from typing import Any

import torch
import torch.distributed as dist

from ..engine import nonblocking
from ..decentralized.topology import Topology
from .basics import default_comm
from .ddp import _future_of

__all__ = ["GossipHookState", "gossip_hook"]


class GossipHookState:
    """What :func:`gossip_hook` needs and keeps: the graph, the communicator, the iteration.

    Parameters
    ----------
    topology
        A :class:`collectives.topology.Topology` over the communicator's ranks (e.g.
        ``collectives.topology.ring(p)``), the same on every rank.
    comm
        MPI communicator with the ranks of DDP's process group, in the same order (default
        ``MPI.COMM_WORLD``, matching :func:`collectives.torch.init_process_group`).
    self_weight, weights
        Override this rank's row of the mixing matrix, as for
        :func:`collectives.neighbor_allreduce`.
    """

    def __init__(self, topology: Topology, comm: Any = None, *, self_weight: float | None = None,
                 weights: dict | None = None) -> None:
        self.comm = default_comm() if comm is None else comm
        if not isinstance(topology, Topology):
            raise TypeError("GossipHookState: topology must be a collectives.topology.Topology "
                            f"(e.g. collectives.topology.ring(p)), got {type(topology).__name__}")
        topology.check_size(self.comm.size, "GossipHookState")
        self.topology, self.self_weight, self.weights = topology, self_weight, weights
        self.iteration = 0

    def state_dict(self) -> dict:
        """The iteration (the step of a time-varying graph), for ``torch.save``."""
        return {"iteration": self.iteration}

    def load_state_dict(self, state: dict) -> None:
        self.iteration = int(state["iteration"])


# real annotations (no ``from __future__ import annotations``): DDP checks them at registration
def gossip_hook(state: GossipHookState,
                bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: replace ``bucket`` by its weighted average with the in-neighbors'
    buckets (one neighbor round, in place)."""
    buf = bucket.buffer()
    request = nonblocking.ineighbor_allreduce(
        buf, state.topology, self_weight=state.self_weight, weights=state.weights, out=buf,
        comm=state.comm, step=state.iteration, name=None)
    if bucket.is_last():
        state.iteration += 1
    return _future_of([request], buf)
