"""``--sync local:H``: local SGD (Lin et al. 2020, *Don't Use Large Mini-Batches, Use Local SGD*).

No gradient exchange; every ``H`` steps, after the update, the parameters are averaged with
``collectives.allreduce``. Momentum buffers stay local, and checkpoints fall right after an
average (``--checkpoint-every`` a multiple of ``H``).
"""

from __future__ import annotations

import argparse

from mpi4py import MPI

from ..fusion import FusionBuffer
from ..timing import Clock
from .base import GOSSIP_DTYPE, BadSyntax, SyncMode, Refusal, dense_average

__all__ = ["Local"]


class Local(SyncMode):
    """Local SGD: the parameters averaged every ``every`` steps (the module docstring)."""

    name = "local"
    forms = "'local:H' with an integer H >= 1"
    label = "local:H"
    help = "'local:H' (local SGD)"
    own_momentum = True
    refuses = (
        Refusal(("--codec",), "--codec compresses gradients, which --sync local:H does not "
                "exchange"),
        Refusal(("--overlap",), "--overlap starts gradient allreduces during backward: --sync "
                "local:H exchanges none"),
        GOSSIP_DTYPE,
    )

    def __init__(self, grads: FusionBuffer, params: FusionBuffer, comm: MPI.Comm,
                 clock: Clock | None = None, *, every: int, algorithm: str = "ring") -> None:
        super().__init__(grads, params, comm, clock)
        self.local_every, self.algorithm = every, algorithm
        self.analytic = algorithm == "native"

    @classmethod
    def from_config(cls, cfg, value, grads, params, state, comm, clock) -> "Local":
        return cls(grads, params, comm, clock, every=value, algorithm=cfg.args.algorithm)

    @classmethod
    def parse(cls, arg: str | None, world: int, comm: MPI.Comm | None = None) -> int:
        if arg is None or not arg.isdigit() or int(arg) < 1:
            raise BadSyntax(arg)
        return int(arg)

    @classmethod
    def every(cls, value: int) -> int:
        return value

    @classmethod
    def check(cls, a: argparse.Namespace, value: int) -> str | None:
        if a.checkpoint_every % value:
            return (f"with --sync local:{value}, --checkpoint-every must be a multiple of "
                    f"{value} (checkpoints are taken right after averaging)")
        return None

    def exchanges_at(self, step: int) -> bool:
        return (step + 1) % self.local_every == 0

    def average_params(self, step: int) -> None:
        if self.exchanges_at(step):
            self._timed(self.params, step, self._average)

    def _average(self, buf: FusionBuffer, step: int) -> None:
        dense_average(buf.flat, self.algorithm, self.comm)
