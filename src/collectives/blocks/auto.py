"""alltoall's "auto": the algorithm the fitted cost model predicts fastest for the block size.

The model (:mod:`collectives.selection.alltoall_model`: pairwise, Bruck and native; the
node-aware one is costed but not chosen, as its measurements disagree with its formula) is
evaluated with the parameters of
:func:`collectives.selection.network.network_for`, the same lookup the allreduce's "auto" reads:
the tuning file's fitted model for this world size (``collectives-tune``), else the built-in
inside-node parameters, and across nodes (``Split_type(COMM_TYPE_SHARED)``, or the emulated
nodes of ``Options.node_size``) the two-level model. The first "auto" call on a communicator
(for each ``Options.node_size``) reads the tuning file on rank 0 and broadcasts it and finds the
node layout (collective); the :class:`Chooser` is then cached in the communicator's context, and
each block size's pick once computed in it, so later calls add no communication.

Equal blocks only: their size is the same on every rank, so every rank picks the same. The v
form (``counts=``; each rank's blocks differ, and Bruck declines them) runs pairwise exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .._runtime.context import Context
from .._runtime.nodes import node_sizes
from ..options import Options
from ..selection import alltoall_model
from ..selection.cost_model import Network
from ..selection.network import network_for, read_entry
from . import native, node_aware
from .handwritten import bruck_alltoall, pairwise_alltoall

__all__ = ["Chooser", "chooser", "choice", "resolve", "alltoall", "FUNCTIONS"]

#: The algorithm function of each name the model may pick.
FUNCTIONS = {"pairwise": pairwise_alltoall, "bruck": bruck_alltoall, "native": native.alltoall,
             "hierarchical": node_aware.alltoall}
_KEY = "alltoall-chooser"


@dataclass
class Chooser:
    """How "auto" chooses on one communicator (the same on every rank)."""

    p: int
    nodes: list[int]                   # ranks per node (node_sizes)
    network: Network
    picks: dict[int, str] = field(default_factory=dict)  # by bytes per block

    def pick(self, block_bytes: int | None) -> str:
        """The name of the algorithm for blocks of ``block_bytes`` (None: the v form)."""
        if block_bytes is None:
            return "pairwise"
        name = self.picks.get(block_bytes)
        if name is None:
            names = alltoall_model.ONE_NODE if len(self.nodes) == 1 else \
                alltoall_model.ACROSS_NODES
            name = self.picks[block_bytes] = alltoall_model.best(block_bytes, self.p,
                                                                 self.network, names)
        return name


def _make(comm: Any, node_size: int | None) -> Chooser:
    entry = read_entry(comm)
    nodes = node_sizes(comm, node_size)
    return Chooser(comm.size, nodes, network_for(entry, nodes))


def chooser(ctx: Context, node_size: int | None = None) -> Chooser:
    """This communicator's :class:`Chooser`, made collectively at first use, then cached."""
    return ctx.cached((_KEY, node_size), lambda comm: _make(comm, node_size))


def choice(ctx: Context, opts: Options, block_bytes: int | None) -> str:
    """The name "auto" runs for blocks of ``block_bytes`` bytes on ``ctx`` (None: the v form)."""
    return chooser(ctx, opts.node_size).pick(block_bytes)


def resolve(ctx: Context, opts: Options, block_bytes: int | None) -> Any:
    """The algorithm function of :func:`choice` (a repeated call resolves once)."""
    return FUNCTIONS[choice(ctx, opts, block_bytes)]


def alltoall(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
             recvoffsets: Sequence[int] | None, ctx: Context, opts: Options) -> None:
    block = None if recvoffsets is not None else int(sendoffsets[1] - sendoffsets[0]) * src.itemsize
    resolve(ctx, opts, block)(src, dst, sendoffsets, recvoffsets, ctx, opts)
