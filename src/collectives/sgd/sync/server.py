"""``--sync ssp:S`` and ``--sync async``: a parameter server over one-sided windows.

The parameters live in a :class:`collectives.ParameterServer` with staleness bound ``S``
(``async``: none). Before each step's gradient a rank reads them (``pull``, waiting for the
bound), computes the gradient and the update on that copy, then pushes its update, averaged over
the ranks, to the server. Under ``ssp:0`` the sum of the ``p`` pushes is synchronous SGD's
averaged update. A push sends the other ranks' shards: ``n (p-1)/p`` bytes, counted
analytically (one-sided messages are not in ``collectives.TRAFFIC``).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import collectives

from ..fusion import FusionBuffer
from ..timing import Clock
from .base import CHECK_REPLICAS, GOSSIP_DTYPE, BadSyntax, SyncMode, Refusal, ring_bytes

__all__ = ["StaleSynchronous", "Asynchronous"]


class StaleSynchronous(SyncMode):
    """The parameter server with staleness bound ``staleness`` (None: no bound)."""

    name = "ssp"
    forms = "'ssp:S' with an integer S >= 0"
    label = "ssp:S"
    help = ("'ssp:S' (a parameter server over one-sided windows: no rank more than S steps "
            "ahead of the slowest; ssp:0 is synchronous)")
    own_momentum = True
    analytic = True
    refuses = (Refusal(CHECK_REPLICAS, "--sync {sync} pushes updates to a parameter server and "
                       "its replicas differ: --codec, --overlap and --check-replicas do not "
                       "apply"),
               GOSSIP_DTYPE)

    def __init__(self, grads: FusionBuffer, params: FusionBuffer, comm: MPI.Comm,
                 clock: Clock | None = None, *, staleness: int | None) -> None:
        super().__init__(grads, params, comm, clock)
        self.server = collectives.ParameterServer(params.flat, staleness=staleness, lr=1.0,
                                                  comm=comm)

    @classmethod
    def from_config(cls, cfg, value, grads, params, state, comm, clock) -> "StaleSynchronous":
        return cls(grads, params, comm, clock, staleness=value)

    @classmethod
    def parse(cls, arg: str | None, world: int, comm: MPI.Comm | None = None) -> int:
        if arg is None or not arg.isdigit():
            raise BadSyntax(arg)
        return int(arg)

    def pull(self, step: int) -> None:
        """Read the server's parameters into ``params`` (waiting for the staleness bound)."""
        self.pulled = self._timed_pull(self.server.pull)

    def average_params(self, step: int) -> None:
        self._timed(self.params, step, self._push)

    def _push(self, buf: FusionBuffer, step: int) -> None:
        """Add this rank's update, averaged over the ranks, to the server's parameters:
        ``(pulled - updated) / p`` with the server's lr of 1."""
        self.server.push((self.pulled - buf.flat) / self.comm.size)

    def _sent(self, buf: FusionBuffer, mark: int) -> int:
        return ring_bytes(buf.flat.nbytes, self.comm.size) // 2  # the other ranks' shards

    def close(self) -> None:
        self.server.free()

    def saved_params(self) -> np.ndarray:
        """The server's parameters, after every push."""
        self.comm.Barrier()
        return self.server.read()

    def restore(self, step: int) -> None:
        """The saved parameters on the server, every clock at ``step``."""
        self.server.reset(self.params.flat, step)


class Asynchronous(StaleSynchronous):
    """The parameter server without a staleness bound."""

    name = "async"
    forms = "'async'"
    label = "async"
    help = "'async' (no bound)"

    @classmethod
    def parse(cls, arg: str | None, world: int, comm: MPI.Comm | None = None) -> None:
        if arg is not None:
            raise BadSyntax(arg)
        return None
