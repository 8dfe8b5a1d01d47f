"""Auto: pick an algorithm from the message size, the number of ranks and the nodes they are on.

Three sources, in order:

1. **A per-machine tuning file** (``collectives-tune`` writes it; where it is looked for and its
   format: :mod:`collectives.selection.tuning_file`). For a world size it covers, tuned on the same
   node layout as this communicator (its ``nodes``; a file without ``nodes`` covers one node),
   the first rule whose ``max_bytes`` is >= the message size names the algorithm.
2. **The two-level cost model**, on a communicator that spans several nodes
   (``Split_type(COMM_TYPE_SHARED)``, or the emulated nodes of ``Options.node_size``):
   "native" up to ``SMALL_BYTES`` (as below), and above it the algorithm the model
   (:mod:`collectives.selection.cost_model`) predicts fastest, "hierarchical" included. Its
   parameters are the tuning file's fitted ``model`` for this world size when it has two levels
   (``collectives-tune`` fits them on the cluster), else
   :data:`~collectives.selection.network.CLUSTER_DEFAULTS` (shared memory
   inside a node, a 10 Gbit/s network between), with the communicator's smallest node as
   ``node_size``. Each size's pick is computed once per communicator.
3. **The built-in rule** otherwise (one node; docs/algorithms.md): "native" for
   ``count < pof2`` or at most ``SMALL_BYTES`` (64 KiB) - there latency is all there is, and
   every hand-written step pays a few microseconds of Python that MPI's C path does not;
   "rabenseifner" above (2 lg p messages and the bandwidth-optimal volume). When every rank
   shares one node, "shm" at every size from ``SHM_BYTES`` (0) up instead: it sends no messages
   at all. A tuned rule naming "shm" on a communicator that spans nodes falls back to this rule.
   On one node the rule, not the fitted model, is the fallback: the model cannot see the per-call
   Python overhead that decides small messages there, and picks recursive doubling where native
   is faster. The measurements behind each choice: docs/benchmarks.md, "Numbers behind the code".

Every rank must pick the same algorithm. At the first "auto" call on a communicator (for each
``Options.node_size``) only rank 0 reads the tuning file and broadcasts its entry, and the ranks
find the node layout together (one ``Split_type``); the resulting selector is cached in the
communicator's context, so later calls add no communication. If the file is malformed, rank 0
warns once (``RuntimeWarning``) and every rank uses the built-in rule (or the default model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from mpi4py import MPI

from .. import selection
from ..selection.network import cluster_model, read_entry
from .._runtime.context import Context
from .._runtime.nodes import node_sizes
from .._runtime.ranks import pof2_of
from ..ops import Op
from ..options import Options
from ..blocks import BARRIER as _BLOCK_BARRIERS
from ..blocks import auto as _blocks_auto
from . import hierarchical, shm, shm_alltoall, shm_barrier
from .flat import FLAT

__all__ = ["algorithm_for", "builtin_choice", "comm_rules", "selector", "resolve", "Selector",
           "allreduce", "barrier", "barrier_for", "alltoall", "alltoall_for", "alltoall_resolved",
           "alltoallv_setup",
           "SMALL_BYTES", "SHM_BYTES", "MODEL_CHOICES"]

SMALL_BYTES = 64 << 10
SHM_BYTES = 0
_SELECTOR_KEY = "auto-selector"

#: What the model chooses among across nodes.
MODEL_CHOICES = ("native", "ring", "tree", "recursive_doubling", "rabenseifner", "hierarchical")
# "shm" does not wait for its kernel to compile (algorithms/shm.py), as "auto" only
_ALL = {**FLAT, "hierarchical": hierarchical.allreduce, "shm": shm.allreduce_without_waiting}


def builtin_choice(nbytes: int, count: int, p: int, one_node: bool = False) -> str:
    """The built-in rule: "shm" from ``SHM_BYTES`` on one node, else "native" up to 64 KiB or
    below ``pof2`` elements, else Rabenseifner."""
    if one_node and nbytes >= SHM_BYTES:
        return "shm"
    if count < pof2_of(p) or nbytes <= SMALL_BYTES:
        return "native"
    return "rabenseifner"


def algorithm_for(nbytes: int, count: int, p: int, rules: selection.Rules | None = None,
           model=None, one_node: bool = False) -> str:
    """The algorithm "auto" runs for ``count`` elements (``nbytes`` bytes) on ``p`` ranks.

    ``rules``: tuned rules for ``p`` (see :mod:`collectives.selection`); else ``model``: a two-level
    :class:`~collectives.selection.cost_model.Network` of the nodes the ranks are on; neither: the
    built-in rule. ``one_node``: whether every rank shares a node (else "shm" is never chosen).
    """
    if rules is not None:
        for limit, name in rules:
            if nbytes <= limit:
                return name if one_node or name != "shm" else builtin_choice(nbytes, count, p)
        raise ValueError("tuning rules must end with an unlimited rule")
    small = builtin_choice(nbytes, count, p, one_node)
    if model is None or small == "native":
        return small
    from ..selection.cost_model import best

    return best(nbytes, p, model, MODEL_CHOICES)


@dataclass
class Selector:
    """How "auto" chooses on one communicator (the same on every rank)."""

    p: int
    nodes: list[int]                  # ranks per node (node_sizes)
    rules: selection.Rules | None = None
    model: object | None = None       # a two-level cost_model.Network, across nodes
    picks: dict[int, str] = field(default_factory=dict)  # the model's pick by message size

    def pick(self, nbytes: int, count: int) -> str:
        """The name of the algorithm for ``count`` elements of ``nbytes`` bytes."""
        if self.model is None or nbytes <= SMALL_BYTES:
            return algorithm_for(nbytes, count, self.p, self.rules, one_node=len(self.nodes) == 1)
        name = self.picks.get(nbytes)
        if name is None:
            name = self.picks[nbytes] = algorithm_for(nbytes, count, self.p, None, self.model)
        return name


def _make_selector(comm: MPI.Comm, node_size: int | None) -> Selector:
    entry = read_entry(comm)
    nodes = node_sizes(comm, node_size)
    sel = Selector(comm.size, nodes)
    if entry is not None and (list(entry.nodes or [comm.size]) == nodes):
        sel.rules = entry.rules
    elif len(nodes) > 1:
        sel.model = cluster_model(entry, nodes)
    return sel


def selector(ctx: Context, node_size: int | None = None) -> Selector:
    """This communicator's :class:`Selector`, made collectively at first use, then cached."""
    return ctx.cached((_SELECTOR_KEY, node_size), lambda comm: _make_selector(comm, node_size))


def comm_rules(ctx: Context) -> selection.Rules | None:
    """The tuned rules auto follows on this communicator (None: none apply)."""
    return selector(ctx).rules


def resolve(buf: np.ndarray, ctx: Context, opts: Options) -> Callable[..., None]:
    """The algorithm function "auto" runs for ``buf`` on ``ctx`` (collective at the first call
    on a communicator; then cached). Every path that runs "auto" resolves through this:
    blocking and non-blocking calls, persistent plans and repeated calls (once), and the
    compressed summable strategy on its representation."""
    return _ALL[selector(ctx, opts.node_size).pick(buf.nbytes, buf.size)]


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    resolve(buf, ctx, opts)(src, buf, op, ctx, opts)


def barrier_for(ctx: Context, opts: Options):
    """The barrier function "auto" runs on ``ctx``: the communicator's shm barrier
    (``shm_barrier.resolved``: no message) when every rank shares one node (as "auto" finds for
    the allreduce, collectively at the first call), else the dissemination barrier."""
    if shm.on_one_node(ctx, opts):
        return shm_barrier.resolved(ctx, opts)
    return _BLOCK_BARRIERS["dissemination"]


def barrier(ctx: Context, opts: Options) -> None:
    """"auto" of :func:`collectives.barrier` (:func:`barrier_for`)."""
    barrier_for(ctx, opts)(ctx, opts)


def alltoall_for(src: np.ndarray, recvoffsets: Sequence[int] | None, ctx: Context,
                 opts: Options) -> Callable:
    """The alltoall function "auto" runs for blocks of ``src`` on ``ctx``: the shared-memory
    alltoall (``shm_alltoall``, not waiting for its kernel) when every rank shares one node
    (found collectively at the first call, as for the barrier), else the cost model's pick
    (``blocks/auto.py``) for equal blocks and pairwise exchange for the v form."""
    if shm.on_one_node(ctx, opts):  # (the v form's was found, and its team made, by
        return shm_alltoall.alltoall_without_waiting  # alltoallv_setup before any message)
    if recvoffsets is not None:  # the v form across nodes: pairwise
        return _blocks_auto.FUNCTIONS["pairwise"]
    return _blocks_auto.resolve(ctx, opts, src.size // ctx.comm.size * src.itemsize)


def alltoallv_setup(ctx: Context, opts: Options) -> Callable | None:
    """What "auto"'s v form does collectively before its first message (the receive counts'
    exchange, after which one rank may raise at its ``out``, the others going on): find whether
    the ranks share one node, and there make the shm team and return the exchange of the counts
    through it (:func:`shm_alltoall.setup_without_waiting`); else None."""
    if shm.on_one_node(ctx, opts):
        return shm_alltoall.setup_without_waiting(ctx, opts)
    return None


def alltoall(src: np.ndarray, dst: np.ndarray, sendoffsets: Sequence[int],
             recvoffsets: Sequence[int] | None, ctx: Context, opts: Options) -> None:
    """"auto" of :func:`collectives.alltoall` (:func:`alltoall_for`)."""
    alltoall_for(src, recvoffsets, ctx, opts)(src, dst, sendoffsets, recvoffsets, ctx, opts)


def alltoall_resolved(src: np.ndarray, dst: np.ndarray, ctx: Context, opts: Options,
                      v: bool = False) -> Callable:
    """What a remembered "auto" alltoall on ``src`` and ``dst`` (of equal blocks, or ``v``: of
    the v form) repeats: :func:`alltoall_for`, as a lane of the shm alltoall where that is it."""
    fn = alltoall_for(src, () if v else None, ctx, opts)
    if fn is shm_alltoall.alltoall_without_waiting:
        return shm_alltoall.lane(fn, src, dst, ctx, opts, v)
    return fn
