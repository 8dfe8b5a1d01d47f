"""``--sync sgp`` and ``--sync sgp:overlap``: stochastic gradient push (Assran et al. 2019).

The parameters are the push-sum ratio ``z / w`` of a :class:`collectives.Window`. After each
local update (added to the numerator ``z``) a rank sends half of ``(z, w)`` to its peer of the
one-peer exponential graph and keeps half. ``sgp`` synchronises the rounds (two barriers: the
mixing matrix of the round exactly); ``sgp:overlap`` combines whatever has arrived (every message
still arrives, and counts, at a later round). One message of the parameters and the weight per
rank and step, counted analytically (one-sided messages are not in ``collectives.TRAFFIC``).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import collectives

from ...decentralized.topology import one_peer_exponential
from ..fusion import FusionBuffer
from ..timing import Clock
from .base import CHECK_REPLICAS, GOSSIP_DTYPE, BadSyntax, SyncMode, Refusal

__all__ = ["PushSum", "PARAMETERS_EXCHANGED"]

#: the refusal of the modes that average parameters with peers through one-sided windows
PARAMETERS_EXCHANGED = Refusal(CHECK_REPLICAS, "--sync {sync} exchanges parameters, not "
                               "gradients, and its replicas differ: --codec, --overlap and "
                               "--check-replicas do not apply")


class PushSum(SyncMode):
    """SGP; ``overlap``: combine what has arrived instead of waiting for the round."""

    name = "sgp"
    forms = "'sgp', 'sgp:overlap'"
    label = "sgp"
    help = ("'sgp' or 'sgp:overlap' (push-sum over the one-peer exponential graph through "
            "one-sided windows; overlap: without waiting for a round's messages)")
    own_params = own_momentum = True
    analytic = True
    refuses = (PARAMETERS_EXCHANGED, GOSSIP_DTYPE)

    def __init__(self, grads: FusionBuffer, params: FusionBuffer, comm: MPI.Comm,
                 clock: Clock | None = None, *, overlap: bool = False) -> None:
        super().__init__(grads, params, comm, clock)
        self.overlap = overlap
        #: the push-sum window (value z, weight w; parameters z / w)
        self.window = collectives.Window(params.flat, comm=comm)
        self.graph = one_peer_exponential(comm.size)

    @classmethod
    def from_config(cls, cfg, value, grads, params, state, comm, clock) -> "PushSum":
        return cls(grads, params, comm, clock, overlap=value)

    @classmethod
    def parse(cls, arg: str | None, world: int, comm: MPI.Comm | None = None) -> bool:
        """None -> False, ``"overlap"`` -> True."""
        if arg not in (None, "overlap"):
            raise BadSyntax(arg)
        return arg is not None

    def pull(self, step: int) -> None:
        """Keep the parameters as they are before the update (the update is added to ``z``)."""
        self.pulled = self.params.flat.copy()

    def average_params(self, step: int) -> None:
        self._timed(self.params, step, self._push_sum)

    def _push_sum(self, buf: FusionBuffer, step: int) -> None:
        """Add this step's update to ``z``, send half of ``(z, w)`` to this step's peer and keep
        half; the parameters become ``z / w``."""
        win = self.window
        win.assign(win.value + (buf.flat - self.pulled))
        peer = (self.graph.out_neighbors(self.comm.rank, step) or (self.comm.rank,))[0]
        win.accumulate(win.estimate, peer, weight=0.5 * win.weight)
        if not self.overlap:
            self.comm.Barrier()  # every message of this round has landed
        win.update(self_weight=0.5)
        if not self.overlap:
            self.comm.Barrier()  # ... and none of the next round's yet: W_t exactly
        buf.flat[...] = win.estimate

    def _sent(self, buf: FusionBuffer, mark: int) -> int:
        """One message of the parameters and the weight (none on one rank)."""
        return buf.flat.nbytes + buf.flat.itemsize if self.comm.size > 1 else 0

    def close(self) -> None:
        self.window.free()

    def restore(self, step: int) -> None:
        """Push-sum restarts from the own parameters, with weight 1."""
        self.window.assign(self.params.flat, weight=1.0)
        self.comm.Barrier()
