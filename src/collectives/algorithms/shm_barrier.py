"""The shared-memory barrier: a one-byte shm allreduce, whose first round no rank leaves before
every rank has entered it.

On one node, ``algorithm="shm"`` of :func:`collectives.barrier` runs the shared-memory
allreduce (``algorithms/shm.py``) on a private one-byte token, reduced in place with ``max``. In
its replicated mode every rank stages the token into its slot and raises its ``READY`` counter,
then waits until every rank's counter has reached the round before it reduces (the protocol:
docs/shm-protocol.md): a rank returns only after every rank has entered the call, which is a
barrier. No MPI message is sent; the team's counters in the window are the only traffic.

The token and the call's lane (the kernel's compiled entry, found once: ``shm.Lane``) are kept
in the communicator's context; a checked call resolves to it once
(:data:`collectives.algorithms.BARRIER_RESOLVERS`), so a repeated barrier is one kernel call.
Failures behave as the allreduce's: a rank that fails elsewhere ends the barrier on every rank
with its error, a rank that never arrives makes the others time out (``Options.timeout``).
Like the allreduce it does not wait for its kernel to compile: the interpreted round driver
stands in meanwhile.

Cost: one hand-off (``p`` cache lines written, each read by every rank) and no system call; a
communicator that spans nodes raises the same ``ValueError`` on every rank ("auto" runs the
dissemination barrier there instead).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from .._runtime.context import Context
from ..ops import get_op
from ..options import Options
from . import shm

__all__ = ["barrier", "resolved"]

_MAX = get_op("max", np.dtype(np.uint8))


def _made(ctx: Context, opts: Options) -> Any:
    """The communicator's resolved barrier: ``lane(token, token, max, ctx, opts)`` with its
    token and lane bound (a C-level partial: no Python frame of its own at each call)."""
    token = np.zeros(1, np.uint8)
    return partial(shm.lane(shm.allreduce_without_waiting, token, token, _MAX, ctx, opts),
                   token, token, _MAX)


def resolved(ctx: Context, opts: Options) -> Any:
    """The communicator's resolved barrier function ``(ctx, opts)`` for these options, made at
    the first call (the team too: off one node, the same ``ValueError`` on every rank, before
    any message)."""
    shm.team(ctx, opts)
    return ctx.cached(("shm-barrier", shm.team_key(opts)), lambda comm: _made(ctx, opts))


def barrier(ctx: Context, opts: Options) -> None:
    """Return once every rank of ``ctx.comm`` (all on one node) has entered."""
    resolved(ctx, opts)(ctx, opts)
