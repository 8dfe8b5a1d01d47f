"""Neighbor collectives over a :class:`~collectives.topology.Topology`: one gossip round.

``neighbor_allreduce(x, topology)`` gives rank ``i`` the weighted average
``W[i, i] x_i + sum_j W[i, j] x_j`` over its in-neighbors ``j`` (row ``i`` of the topology's
mixing matrix, or the caller's ``self_weight``/``weights``); ``neighbor_allgather(x, topology)``
gives it the in-neighbors' arrays themselves, stacked in ascending rank order. Repeated on a
doubly stochastic topology, the average drives every rank's value to the mean over all ranks
(D-PSGD's averaging step, Lian et al. 2017; the rate is the topology's spectral gap).

How a round runs. Every rank posts one receive per in-neighbor (into scratch) and sends its
``x`` to every out-neighbor, all at once, then waits for all of them; then it combines: the
result starts as ``self_weight * x`` and adds ``weight_j * block_j`` for each in-neighbor in
ascending rank order (float16 and bfloat16 accumulate in float32 and round once), so it is a
fixed function of the inputs, bitwise the same on every repetition. Backends (:data:`BACKENDS`):

- ``"p2p"`` (default): the library's own messages (``_runtime/p2p.exchange``), tagged with the
  call and waited for under the communicator's guard (a failing rank is an error everywhere;
  ``Options.timeout``), counted in ``collectives.TRAFFIC``;
- ``"mpi"``: MPI-3's neighborhood collective ``MPI_Ineighbor_allgather`` on a distributed-graph
  communicator (``MPI_Dist_graph_create_adjacent``, made collectively at the first call with a
  topology and step of the period, after a guarded exchange of tokens with every rank, then
  cached), under the guard like the library's other native operations (once a failure is known it
  runs the ``"p2p"`` exchange instead). Each rank sends
  one buffer to all its out-neighbors, which is an allgather over the graph, not an alltoallv.
  Its bytes are not counted in TRAFFIC (MPI's own collectives never are).

Cost of a round with ``d`` in- and out-neighbors and ``n`` bytes: ``d`` messages out and in,
overlapping, about ``alpha + d n beta`` where the links are shared, plus ``d n gamma`` for the
combination; the one-peer exponential graph has ``d = 1`` at every ``p``, against
``2 n (p-1)/p beta`` and ``2 (p-1) alpha`` of a ring allreduce.

Checks (before any message): the topology is a :class:`~collectives.topology.Topology` for the
communicator's size (every rank raises the same ValueError), a time-varying one gets ``step``,
the dtype is a float, ``weights`` name exactly this rank's in-neighbors and with ``self_weight``
are non-negative and sum to 1 (an error on one rank reaches the others through the guard).
Every rank must pass the same topology and step: ``validate=True`` cross-checks them (the
topology's fingerprint), as it does count and dtype.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
from compress.arrays import is_bfloat16, is_numpy
from compress.bfloat16 import narrow, widen
from mpi4py import MPI

from .._runtime import p2p
from .._runtime.arrays import check_input, check_out, copy_into, flat, new_like, returned
from .._runtime.blocking import run_call
from .._runtime.release import park
from .._runtime.validate import lookup
from .._runtime.workspace import forget, scratch
from .neighbor_hierarchical import DTYPES as _HIER_DTYPES, HierarchicalRound
from ..options import Options
from .topology import Topology
from .._runtime.context import Context

__all__ = ["neighbor_allreduce", "neighbor_allgather", "NeighborAllreduceCall",
           "NeighborAllgatherCall", "BACKENDS"]

_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_TOL = 1e-6  # weights given by the caller must sum to 1 within this


# -- backends: fill recv[k] with the array of sources[k]; return the buffer that holds them --------
def _p2p(src: np.ndarray, recv: np.ndarray, sources: tuple[int, ...], dests: tuple[int, ...],
         ctx: Context, key: tuple) -> np.ndarray:
    p2p.exchange(ctx.comm, [(src, d) for d in dests],
                 [(recv[k], s) for k, s in enumerate(sources)], ctx.active)
    return recv


class _DistGraph:
    """A distributed-graph communicator over the context's communicator, freed with it; parked
    instead, never freed before exit, where the context's guard retired native: MPI's neighbor
    collectives on it may then have gone different ways on different ranks, and their messages
    must not reach a later communicator with its context id (``_runtime/release.py``, step 4)."""

    def __init__(self, comm: MPI.Comm, sources: tuple[int, ...], dests: tuple[int, ...],
                 owner: Context) -> None:
        self.comm = comm.Create_dist_graph_adjacent(list(sources), list(dests), reorder=False)
        self.owner = owner

    def free(self) -> None:
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            guard = self.owner._guard
            if guard is not None and guard.retired:
                park(self.comm)
            else:
                self.comm.Free()


def _graph(ctx: Context, key: tuple, sources: tuple[int, ...], dests: tuple[int, ...]) -> MPI.Comm:
    """The distributed-graph communicator of ``key`` (topology, step), made at its first use.
    Making it is an MPI collective, which no notice can interrupt: under a guard, every rank
    first trades a one-byte token with every other through guarded messages, so a rank that
    failed before (its own bad weights) makes the others raise here instead of waiting in it."""
    name = ("dist_graph", *key)
    if name not in ctx.cache and ctx.active is not None:
        comm = ctx.comm
        others = [r for r in range(comm.size) if r != comm.rank]
        token, got = np.zeros(1, np.uint8), np.empty(len(others), np.uint8)
        p2p.exchange(comm, [(token, r) for r in others],
                     [(got[k:k + 1], r) for k, r in enumerate(others)], ctx.active)
    return ctx.cached(name, lambda c: _DistGraph(c, sources, dests, ctx)).comm


def _mpi(src: np.ndarray, recv: np.ndarray, sources: tuple[int, ...], dests: tuple[int, ...],
         ctx: Context, key: tuple) -> np.ndarray:
    graph = _graph(ctx, key, sources, dests)
    args = ([src, MPI.BYTE], [recv, MPI.BYTE])
    guard = ctx.active
    if guard is None:
        graph.Neighbor_allgather(*args)
        return recv
    out = [recv]

    def fallback() -> None:  # the abandoned operation may still write recv: receive elsewhere
        forget("neighbor", recv)
        out[0] = scratch("neighbor", recv.size, recv).reshape(recv.shape)
        _p2p(src, out[0], sources, dests, ctx, key)

    if not guard.native(lambda: graph.Ineighbor_allgather(*args), fallback, args):
        return out[0]
    return recv


#: name -> backend (module docstring)
BACKENDS: dict[str, Callable[..., np.ndarray]] = {"p2p": _p2p, "mpi": _mpi}


# -- the calls -------------------------------------------------------------------------------------
def _round(comm: MPI.Comm, x: Any, topology: object, step: int | None, backend: str,
           what: str) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...], int, Callable]:
    """Checks shared by both calls: (array, sources, dests, step index, backend function)."""
    if not isinstance(topology, Topology):
        raise TypeError(f"{what}: topology must be a collectives.topology.Topology (e.g. "
                        f"collectives.topology.ring(p)), got {type(topology).__name__}")
    topology.check_size(comm.size, what)
    t = topology.phase(step)
    fn = lookup(BACKENDS, backend, "backend")
    a = check_input(x)
    if not is_numpy(a):
        raise TypeError(f"{what}: x must be a host array (NumPy or a CPU tensor); device "
                        f"arrays are not supported yet")
    r = comm.rank
    return a, topology.in_neighbors(r, t), topology.out_neighbors(r, t), t, fn


def _recv_weights(topology: Topology, rank: int, t: int, sources: tuple[int, ...],
                  self_weight: float | None, weights: Mapping[int, float] | None
                  ) -> tuple[float, list[float]]:
    """This rank's ``(self_weight, [weight of each source])``: the topology's row, or the
    caller's (``self_weight`` alone: the rest shared evenly; ``weights`` alone: the self weight
    is what remains), checked to be non-negative and to sum to 1."""
    row = topology.weights(t)[rank]
    if self_weight is None and weights is None:
        return float(row[rank]), [float(row[j]) for j in sources]
    if self_weight is not None and not _real(self_weight):
        raise TypeError(f"self_weight must be a real number, got {self_weight!r}")
    if weights is not None:
        if not isinstance(weights, Mapping) or not all(
                isinstance(k, (int, np.integer)) and _real(v) for k, v in weights.items()):
            raise TypeError(f"weights must be a dict {{in-neighbor rank: weight}} of integers "
                            f"to real numbers, got {weights!r}"[:300])
        given = sorted(int(k) for k in weights)
        if given != list(sources):
            raise ValueError(f"weights on rank {rank} name ranks {given}, but its in-neighbors "
                             f"in {topology.name} are {list(sources)}")
        ws = [float(weights[j]) for j in sources]
    else:
        share = (1.0 - float(self_weight)) / len(sources) if sources else 0.0
        ws = [share] * len(sources)
    sw = 1.0 - float(sum(ws)) if self_weight is None else float(self_weight)
    every = [sw, *ws]
    if not all(np.isfinite(every)) or min(every) < 0 or abs(sum(every) - 1) > _TOL:
        raise ValueError(f"weights on rank {rank} are not stochastic: self {sw:g} and "
                         f"in-neighbors {dict(zip(sources, ws))} must be non-negative and sum "
                         f"to 1 (they sum to {sum(every):.9g})")
    return sw, ws


def _real(v: object) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


class NeighborAllreduceCall:
    """A checked neighbor allreduce: ``run(ctx)`` leaves the weighted average in ``result``."""

    kind = "neighbor_allreduce"
    __slots__ = ("src", "dst", "sources", "dests", "self_weight", "weights", "fn", "key",
                 "backend", "opts", "result", "trivial", "topology", "hierarchical")

    def __init__(self, comm: MPI.Comm, x: Any, topology: Topology, self_weight: float | None,
                 weights: Mapping[int, float] | None, out: Any, step: int | None, backend: str,
                 hierarchical: bool, opts: Options) -> None:
        a, self.sources, self.dests, t, self.fn = _round(comm, x, topology, step, backend,
                                                         self.kind)
        if a.dtype not in _FLOATS and not is_bfloat16(a.dtype):
            raise TypeError(f"{self.kind}: x has dtype {a.dtype}; a weighted average needs "
                            f"float16, bfloat16, float32 or float64")
        if not isinstance(hierarchical, bool):
            raise TypeError(f"{self.kind}: hierarchical must be True or False, got "
                            f"{hierarchical!r}")
        self.hierarchical = HierarchicalRound(topology, t, opts) if hierarchical else None
        if hierarchical:  # neighbor_hierarchical.py: what a hierarchical round accepts
            if self_weight is not None or weights is not None:
                raise ValueError(f"{self.kind}: hierarchical=True takes the topology's weights "
                                 f"(every rank of a node has its node's row); self_weight= and "
                                 f"weights= do not apply")
            if backend != "p2p":
                raise ValueError(f"{self.kind}: hierarchical=True runs its own exchange between "
                                 f"nodes; backend must be 'p2p', got {backend!r}")
            if a.dtype not in _HIER_DTYPES:
                raise TypeError(f"{self.kind}: hierarchical=True averages nodes in the "
                                f"shared-memory kernels: float32 or float64, got {a.dtype}")
            self.self_weight, self.weights = 1.0, []
        else:
            self.self_weight, self.weights = _recv_weights(topology, comm.rank, t,
                                                           self.sources, self_weight, weights)
        res = new_like(a) if out is None else check_out(out, a)
        self.src = flat(a)
        self.dst = self.src if res is a else flat(res)
        self.key, self.topology = (topology.fingerprint, t), topology
        self.backend, self.opts, self.result = backend, opts, returned(x, out, res)
        self.trivial = a.size == 0 or comm.size == 1

    def signature(self) -> dict[str, Any]:
        return {"count": self.src.size, "dtype": self.src.dtype, "backend": self.backend,
                "topology": f"{self.topology.name} {self.key[0]}", "step % period": self.key[1],
                "hierarchical": self.hierarchical is not None}

    def run(self, ctx: Context) -> None:
        if self.trivial:  # one process (W = [[1]]) or nothing to send
            copy_into(self.src, self.dst)
            return
        if self.hierarchical is not None:  # neighbor_hierarchical.py
            self.hierarchical.run(self.src, self.dst, ctx)
            return
        src, dst, n = self.src, self.dst, self.src.size
        recv = scratch("neighbor", len(self.sources) * n, src).reshape(len(self.sources), n)
        recv = self.fn(src, recv, self.sources, self.dests, ctx, self.key)
        words = dst.dtype == np.uint16  # bfloat16, as raw words (flat())
        if dst.dtype in (np.float32, np.float64):
            acc, values = dst, (lambda a: a)
        else:  # float16 and bfloat16 values in float32, exactly
            acc = scratch("neighbor.acc", n, np.empty(0, np.float32))
            values = widen if words else (lambda a: a.astype(np.float32))
        np.multiply(values(src), self.self_weight, out=acc)  # dst may be src: read before written
        for k, w in enumerate(self.weights):  # ascending source rank: a fixed order
            block = values(recv[k])  # recv is scratch: scaled in place
            np.multiply(block, w, out=block)
            np.add(acc, block, out=acc)
        if words:
            narrow(acc, dst)  # rounded once, nearest even
        elif acc is not dst:
            dst[...] = acc


class NeighborAllgatherCall:
    """A checked neighbor allgather: ``run(ctx)`` stacks the in-neighbors' arrays in ``result``
    (shape ``(d_in, *x.shape)``, ascending source rank)."""

    kind = "neighbor_allgather"
    __slots__ = ("src", "dst", "sources", "dests", "fn", "key", "backend", "opts", "result",
                 "trivial", "topology")

    def __init__(self, comm: MPI.Comm, x: Any, topology: Topology, out: Any, step: int | None,
                 backend: str, opts: Options) -> None:
        a, self.sources, self.dests, t, self.fn = _round(comm, x, topology, step, backend,
                                                         self.kind)
        shape = (len(self.sources), *a.shape)
        res = new_like(a, shape) if out is None else check_out(out, a, shape)
        self.src, self.dst = flat(a), flat(res)
        self.key, self.topology = (topology.fingerprint, t), topology
        self.backend, self.opts, self.result = backend, opts, returned(x, out, res)
        self.trivial = a.size == 0 or comm.size == 1  # no in-neighbors, or nothing to send

    def signature(self) -> dict[str, Any]:
        return {"count": self.src.size, "dtype": self.src.dtype, "backend": self.backend,
                "topology": f"{self.topology.name} {self.key[0]}", "step % period": self.key[1]}

    def run(self, ctx: Context) -> None:
        if self.trivial:
            return
        n = self.src.size
        d = len(self.sources)
        if self.fn is _p2p:  # straight into the result
            _p2p(self.src, self.dst.reshape(d, n), self.sources, self.dests, ctx, self.key)
            return
        recv = scratch("neighbor", d * n, self.src).reshape(d, n)
        copy_into(self.fn(self.src, recv, self.sources, self.dests, ctx, self.key).reshape(-1),
                  self.dst)


def neighbor_allreduce(x: Any, topology: Topology, *, self_weight: float | None = None,
                       weights: Mapping[int, float] | None = None, out: Any = None,
                       comm: MPI.Comm | None = None, step: int | None = None,
                       backend: str = "p2p", hierarchical: bool = False,
                       validate: bool | None = None, options: Options | None = None) -> Any:
    """One gossip round: the weighted average of this rank's ``x`` and its in-neighbors'.

    Parameters
    ----------
    x
        Contiguous float array (float16, bfloat16, float32, float64); the same shape and dtype
        on every rank.
    topology
        A :class:`collectives.topology.Topology` for ``comm.size`` ranks, the same on every rank.
    self_weight, weights
        Override this rank's row of the mixing matrix: ``weights`` maps each in-neighbor rank
        (all of them) to its weight. Given alone, ``self_weight`` leaves the in-neighbors equal
        shares of the rest, and ``weights`` leaves itself the rest. Non-negative, summing to 1.
    out
        Result array (``x``'s shape and dtype); ``out=x`` works in place. None: a new array.
    comm
        Intracommunicator (default ``MPI.COMM_WORLD``).
    step
        The round's number, for a time-varying topology (``one_peer_exponential``); the same on
        every rank. Ignored by static ones.
    backend
        "p2p" (the library's guarded messages) or "mpi" (``MPI_Ineighbor_allgather``).
    hierarchical
        Average inside each node through shared memory, then gossip between nodes (one
        exchange per neighbor node, :mod:`collectives.decentralized.neighbor_hierarchical`); the same value
        to rounding, for a topology whose vertices are nodes
        (:func:`collectives.topology.hierarchical_for` with the same ``Options.node_size``).
        float32/float64, the topology's weights and the "p2p" backend only.
    validate, options
        As for :func:`collectives.allreduce`.

    Returns
    -------
    ``out``, holding ``W[i, i] x_i + sum_j W[i, j] x_j``; the same bits on every repetition.
    """
    return run_call(NeighborAllreduceCall, comm, options, validate, x, topology, self_weight,
                    weights, out, step, backend, hierarchical).result


def neighbor_allgather(x: Any, topology: Topology, *, out: Any = None,
                       comm: MPI.Comm | None = None, step: int | None = None,
                       backend: str = "p2p", validate: bool | None = None,
                       options: Options | None = None) -> Any:
    """The in-neighbors' ``x``, stacked: shape ``(len(topology.in_neighbors(rank, step)),
    *x.shape)``, in ascending source rank. Any dtype; parameters as :func:`neighbor_allreduce`.
    """
    return run_call(NeighborAllgatherCall, comm, options, validate, x, topology, out, step,
                    backend).result
