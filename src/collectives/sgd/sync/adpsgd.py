"""``--sync adpsgd[:GRAPH]``: asynchronous decentralized SGD (AD-PSGD, Lian et al. 2018).

No global step: every rank's parameters live in a :class:`collectives.PairwiseAveraging` window
over a static graph (ring by default; its edges are the pairs that may average, its weights play
no part). Each step reads them (``pull``), computes the gradient and the momentum update on that
copy, then atomically replaces its own and one random neighbor's parameters by their mean and
adds its update to its own. Peers change a rank's parameters between its steps. The bytes are
the get and the put of the peer's parameters, counted by the window.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import collectives

from ...decentralized.topology import Topology
from ...decentralized.topology import parse as parse_topology
from ..fusion import FusionBuffer
from ..timing import Clock
from .base import GOSSIP_DTYPE, SyncMode
from .pushsum import PARAMETERS_EXCHANGED

__all__ = ["PairwiseGossip"]


class PairwiseGossip(SyncMode):
    """AD-PSGD over ``topology``; ``seed`` draws the neighbors."""

    name = "adpsgd"
    forms = "'adpsgd[:GRAPH]'"
    label = "adpsgd"
    help = ("'adpsgd[:GRAPH]' (AD-PSGD: after each step, atomically average the parameters "
            "with one random neighbor of the static graph, ring by default, through one-sided "
            "windows; no global step)")
    own_params = own_momentum = True
    analytic = True
    refuses = (PARAMETERS_EXCHANGED, GOSSIP_DTYPE)

    def __init__(self, grads: FusionBuffer, params: FusionBuffer, comm: MPI.Comm,
                 clock: Clock | None = None, *, topology: Topology, seed: int = 0) -> None:
        super().__init__(grads, params, comm, clock)
        #: every rank's parameters, in a window
        self.pairwise = collectives.PairwiseAveraging(params.flat, topology, comm=comm,
                                                      seed=seed)

    @classmethod
    def from_config(cls, cfg, value, grads, params, state, comm, clock) -> "PairwiseGossip":
        return cls(grads, params, comm, clock, topology=value, seed=cfg.args.seed)

    @classmethod
    def parse(cls, arg: str | None, world: int, comm: MPI.Comm | None = None) -> Topology:
        """None -> the ring over ``world`` ranks, ``"GRAPH[:WEIGHTS]"`` -> that static graph.
        Raises ValueError naming the valid graphs, or for a graph that changes every step."""
        topology = parse_topology("ring" if arg is None else arg, world)
        if topology.dynamic:
            raise ValueError(f"{topology.name} changes every step; AD-PSGD averages over the "
                             f"edges of a static graph (ring, torus, exponential, full)")
        return topology

    def pull(self, step: int) -> None:
        """Read this rank's parameters from its window (peers' averages since the last step
        included)."""
        self.pulled = self._timed_pull(lambda: self.pairwise.value)

    def average_params(self, step: int) -> None:
        self._timed(self.params, step, self._pairwise)

    def _pairwise(self, buf: FusionBuffer, step: int) -> None:
        """This rank's and a random neighbor's parameters become their mean, atomically, and
        this step's update (``updated - pulled``) is added to this rank's."""
        pw = self.pairwise
        buf.flat[...] = pw.average(pw.peer(step), buf.flat - self.pulled)

    def _mark(self) -> int:
        return self.pairwise.elements_moved

    def _sent(self, buf: FusionBuffer, mark: int) -> int:
        """The get and the put of the peer's parameters."""
        return (self.pairwise.elements_moved - mark) * buf.flat.itemsize

    def close(self) -> None:
        self.pairwise.free()

    def saved_params(self) -> np.ndarray:
        """This rank's window, once no average is under way."""
        self.comm.Barrier()
        return self.pairwise.value

    def restore(self, step: int) -> None:
        """The saved parameters in the window."""
        self.pairwise.assign(self.params.flat)
        self.comm.Barrier()
