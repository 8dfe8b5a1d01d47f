"""Communication graphs with mixing weights, for decentralized (gossip) training.

A :class:`Topology` of ``p`` ranks is a periodic sequence of ``p x p`` mixing matrices ``W_t``
(a static graph has period 1). ``W[i, j]`` is the weight rank ``i`` gives to the value of rank
``j``: one gossip round replaces every rank's ``x_i`` by ``sum_j W[i, j] x_j``
(:func:`collectives.neighbor_allreduce`). Rank ``j != i`` is an *in-neighbor* of ``i`` when
``W[i, j] != 0``; ``i`` is then one of ``j``'s *out-neighbors* (``j`` sends to ``i``).

What each algorithm needs of ``W`` (``Topology.check``):

- *row-stochastic* (every row sums to 1, non-negative): each round is a weighted average; the
  least :func:`~collectives.neighbor_allreduce` accepts;
- *column-stochastic* (every column sums to 1): the sum over ranks is preserved; enough for
  push-sum (Kempe et al. 2003; SGP, Assran et al. 2019, *Stochastic Gradient Push for
  Distributed Deep Learning*), which divides the weight out;
- *doubly stochastic* (both): repeated rounds converge to the exact average, as D-PSGD needs
  (Lian et al. 2017, *Can Decentralized Algorithms Outperform Centralized Algorithms?*; also
  CHOCO-SGD, Koloskova et al. 2019).

The consensus rate. For doubly stochastic ``W``, ``W x - xbar = (W - J)(x - xbar)`` with
``J = 11^T / p``, so ``||x_k - xbar|| <= rho^k ||x_0 - xbar||`` with ``rho = ||W - J||_2``
(for symmetric ``W``, the second-largest eigenvalue modulus). :attr:`Topology.rho` is that
contraction per round (for a time-varying graph: of the product over one period, to the power
``1 / period``); :attr:`Topology.spectral_gap` is ``1 - rho``. A gap of 1 averages exactly in
one round (fully connected); the ring's gap shrinks as ``1/p^2``.

The catalogue (:data:`GRAPHS`; every builder takes the rank count ``p``, any ``p >= 1``):

======================  =======================================================================
``ring``                rank ``i`` with ``i - 1`` and ``i + 1`` (mod p), undirected
``torus``               a ``rows x cols`` grid with wrap-around (``rows`` the largest divisor of
                        ``p`` not above ``sqrt(p)``; a prime ``p`` gives the ring), undirected
``exponential``         static exponential graph (Assran et al. 2019): rank ``i`` sends to
                        ``i + 2^k`` (mod p), ``k = 0 .. ceil(log2 p) - 1``; directed
``one_peer_exponential``  the same offsets one at a time: at step ``t`` only
                        ``k = t mod ceil(log2 p)``, so every rank sends one message per round;
                        period ``ceil(log2 p)``; for ``p`` a power of two one period averages
                        exactly
``full``                every rank with every rank, ``W = J``
======================  =======================================================================

and :func:`hierarchical` (the ranks of a node as one vertex, nodes joined by one of the
undirected graphs above; :func:`hierarchical_for` reads a communicator's nodes),
:func:`from_adjacency` and :func:`from_weights` (a user's own).

Weights (``weights=``): ``"uniform"`` gives a rank and each of its in-neighbors ``1 / (d_in + 1)``
(doubly stochastic on regular graphs: all of the catalogue); ``"metropolis"``
(Metropolis-Hastings, undirected graphs only) gives edge ``(i, j)`` ``1 / (1 + max(d_i, d_j))``
and ``i`` the rest, doubly stochastic on any undirected graph.

The builders (all but :func:`hierarchical_for`) are pure functions of their arguments, without
MPI, so every rank that builds the same topology has bitwise the same matrices; a
:class:`Topology` is immutable.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["Topology", "GRAPHS", "WEIGHTS", "REQUIREMENTS", "build", "ring", "torus",
           "exponential", "one_peer_exponential", "full", "hierarchical", "hierarchical_for",
           "from_adjacency",
           "from_weights", "parse"]

#: the properties of W an algorithm may require (:meth:`Topology.check`)
REQUIREMENTS = ("row", "column", "doubly")
#: tolerance of the stochasticity checks (sums of float64 weights)
_TOL = 1e-9


class Topology:
    """A periodic sequence of mixing matrices over ``size`` ranks (see the module docstring).

    Parameters
    ----------
    name
        What to call it in messages (``"ring(5)"``).
    matrices
        One ``size x size`` matrix per step of the period; row ``i`` holds the weights rank
        ``i`` gives to itself and its in-neighbors. Checked: square, finite, non-negative, the
        same size, every one row-stochastic, and the graph (the union over the period)
        strongly connected.

    Raises
    ------
    ValueError
        A matrix fails one of those checks; the message says which and where.
    """

    __slots__ = ("name", "size", "period", "_w", "_in", "_out", "_stochastic", "_rho",
                 "fingerprint")

    def __init__(self, name: str, matrices: Sequence[np.ndarray]) -> None:
        if len(matrices) == 0:
            raise ValueError(f"{name}: a topology needs at least one weight matrix")
        ws = []
        for t, m in enumerate(matrices):
            w = np.array(m, dtype=np.float64)  # a private copy
            where = f"{name}: weight matrix" + (f" of step {t}" if len(matrices) > 1 else "")
            if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
                raise ValueError(f"{where} must be square (p x p, p >= 1), got shape {w.shape}")
            if ws and w.shape != ws[0].shape:
                raise ValueError(f"{where} has shape {w.shape}, step 0's {ws[0].shape}")
            if not np.isfinite(w).all():
                raise ValueError(f"{where} has entries that are not finite")
            if (w < 0).any():
                i, j = np.argwhere(w < 0)[0]
                raise ValueError(f"{where} has a negative weight W[{i}, {j}] = {w[i, j]:g}")
            rows = w.sum(axis=1)
            bad = np.flatnonzero(np.abs(rows - 1) > _TOL)
            if bad.size:
                raise ValueError(f"{where} is not row-stochastic: row {bad[0]} (the weights rank "
                                 f"{bad[0]} gives itself and its in-neighbors) sums to "
                                 f"{rows[bad[0]]:.12g}, not 1")
            w.setflags(write=False)
            ws.append(w)
        self.name, self.size, self.period = name, ws[0].shape[0], len(ws)
        self._w = tuple(ws)
        p = self.size
        self._in = tuple(tuple(tuple(int(j) for j in np.flatnonzero(w[i]) if j != i)
                               for i in range(p)) for w in ws)
        self._out = tuple(tuple(tuple(int(j) for j in np.flatnonzero(w[:, i]) if j != i)
                                for i in range(p)) for w in ws)
        union = sum((w != 0).astype(np.int64) for w in ws)
        unreached = _unreached(union)
        if unreached:
            raise ValueError(f"{name}: the graph is not connected: rank{'s' * (len(unreached) > 1)}"
                             f" {', '.join(map(str, unreached[:8]))}"
                             f"{' ...' if len(unreached) > 8 else ''} cannot reach or be reached "
                             f"from rank 0" + (" over one period" if len(ws) > 1 else ""))
        cols = [np.abs(w.sum(axis=0) - 1).max() <= _TOL for w in ws]
        self._stochastic = "doubly" if all(cols) else "row"
        self._rho: float | None = None
        h = hashlib.blake2b(digest_size=8)
        for w in ws:
            h.update(w.tobytes())
        self.fingerprint = h.hexdigest()

    # -- the graph at one step -----------------------------------------------------------------
    def phase(self, step: int | None) -> int:
        """The index in the period of ``step`` (0 for a static topology, whatever ``step``);
        ValueError for a time-varying one without a non-negative integer ``step``."""
        if self.period == 1:
            return 0
        if step is None or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"{self.name} changes every step (period {self.period}): pass "
                             f"step=, a non-negative integer (the same on every rank), got "
                             f"{step!r}")
        return int(step) % self.period

    def weights(self, step: int | None = None) -> np.ndarray:
        """The mixing matrix of ``step`` (read-only); ``step`` is needed when the period is > 1."""
        return self._w[self.phase(step)]

    def in_neighbors(self, rank: int, step: int | None = None) -> tuple[int, ...]:
        """The ranks whose values ``rank`` receives at ``step``, ascending."""
        return self._in[self.phase(step)][rank]

    def out_neighbors(self, rank: int, step: int | None = None) -> tuple[int, ...]:
        """The ranks ``rank`` sends its value to at ``step``, ascending."""
        return self._out[self.phase(step)][rank]

    def recv_weights(self, rank: int, step: int | None = None) -> tuple[float, dict[int, float]]:
        """``(self_weight, {in-neighbor: weight})`` of ``rank`` at ``step`` (BlueFog's form)."""
        w = self.weights(step)
        return float(w[rank, rank]), {j: float(w[rank, j]) for j in self.in_neighbors(rank, step)}

    # -- properties ------------------------------------------------------------------------------
    @property
    def dynamic(self) -> bool:
        """Whether the graph changes with the step (period > 1)."""
        return self.period > 1

    @property
    def stochastic(self) -> str:
        """``"doubly"`` if every matrix is also column-stochastic, else ``"row"``."""
        return self._stochastic

    @property
    def rho(self) -> float:
        """The consensus contraction per round: ``||prod_t (W_t - J)||_2 ** (1 / period)``
        (module docstring). Only meaningful for doubly stochastic topologies."""
        if self._rho is None:
            p = self.size
            m = np.eye(p)
            for w in self._w:  # x_{t+1} - xbar = (W_t - J)(x_t - xbar)
                m = (w - 1.0 / p) @ m
            rho = float(np.linalg.norm(m, 2)) if p > 1 else 0.0
            self._rho = min(1.0, rho) ** (1.0 / self.period)
        return self._rho

    @property
    def spectral_gap(self) -> float:
        """``1 - rho``: 1 averages exactly each round, 0 never converges."""
        return 1.0 - self.rho

    def check(self, require: str, what: str = "") -> None:
        """Raise ValueError unless the matrices are ``require`` ("row", "column" or "doubly")
        stochastic; ``what`` names the algorithm that requires it in the message."""
        if require not in REQUIREMENTS:
            raise ValueError(f"unknown requirement {require!r}; valid choices: "
                             f"{', '.join(REQUIREMENTS)}")
        if require == "row":
            return  # every Topology is
        for t, w in enumerate(self._w):
            cols = w.sum(axis=0)
            bad = np.flatnonzero(np.abs(cols - 1) > _TOL)
            if bad.size:
                who = f"{what} needs" if what else "need"
                raise ValueError(
                    f"{self.name}: {who} a {require} stochastic weight matrix, but column "
                    f"{bad[0]} (the weights rank {bad[0]}'s value gets) "
                    f"{'of step ' + str(t) + ' ' if self.period > 1 else ''}sums to "
                    f"{cols[bad[0]]:.12g}, not 1 (use weights='metropolis' on an undirected "
                    f"graph, or a regular graph)")

    def check_size(self, size: int, what: str = "neighbor_allreduce") -> None:
        """Raise ValueError unless the topology is for ``size`` ranks."""
        if size != self.size:
            raise ValueError(f"{what}: topology {self.name} is for {self.size} rank"
                             f"{'s' * (self.size != 1)}, the communicator has {size}")

    def messages(self, step: int | None = None) -> int:
        """The largest number of messages a rank sends in one round at ``step``."""
        return max(len(o) for o in self._out[self.phase(step)])

    def __repr__(self) -> str:
        return (f"Topology({self.name}, size={self.size}, period={self.period}, "
                f"{self.stochastic} stochastic, spectral_gap={self.spectral_gap:.4f})")


def _unreached(adjacency: np.ndarray) -> list[int]:
    """Ranks not strongly connected with rank 0 in the directed graph of ``adjacency != 0``."""
    a = adjacency != 0
    p = a.shape[0]

    def reach(m: np.ndarray) -> np.ndarray:
        seen = np.zeros(p, dtype=bool)
        seen[0] = True
        frontier = seen.copy()
        while frontier.any():
            frontier = m[:, frontier].any(axis=1) & ~seen
            seen |= frontier
        return seen

    both = reach(a) & reach(a.T)
    return [int(i) for i in np.flatnonzero(~both)]


# -- weights -----------------------------------------------------------------------------------
def _uniform(adj: np.ndarray) -> np.ndarray:
    """Rank ``i`` and each of its in-neighbors (``adj[i, j]``) get ``1 / (d_in(i) + 1)``."""
    a = adj.astype(bool)
    np.fill_diagonal(a, True)
    return a / a.sum(axis=1, keepdims=True)


def _metropolis(adj: np.ndarray) -> np.ndarray:
    """Metropolis-Hastings: ``W_ij = 1 / (1 + max(d_i, d_j))`` on an edge, ``W_ii`` the rest."""
    a = adj.astype(bool)
    np.fill_diagonal(a, False)
    if (a != a.T).any():
        i, j = np.argwhere(a & ~a.T)[0]
        raise ValueError(f"weights='metropolis' needs an undirected graph, but rank {j} sends to "
                         f"rank {i} and rank {i} does not send to rank {j} (use "
                         f"weights='uniform')")
    d = a.sum(axis=1)
    w = np.where(a, 1.0 / (1.0 + np.maximum(d[:, None], d[None, :])), 0.0)
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


#: name -> function(adjacency) -> weight matrix
WEIGHTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "uniform": _uniform, "metropolis": _metropolis}


def _weighted(name: str, adj: np.ndarray, weights: str) -> Topology:
    if not isinstance(weights, str) or weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; valid choices: {', '.join(WEIGHTS)}")
    return Topology(name, [WEIGHTS[weights](adj)])


def _check_p(p: object, what: str) -> int:
    if not isinstance(p, (int, np.integer)) or isinstance(p, bool) or p < 1:
        raise ValueError(f"{what}: the rank count must be a positive integer, got {p!r}")
    return int(p)


# -- adjacency of the catalogue ------------------------------------------------------------------
def _circulant(p: int, offsets: Sequence[int]) -> np.ndarray:
    """``adj[i, j]``: ``i`` receives from ``j = i - o`` (mod p), i.e. ``j`` sends to ``j + o``."""
    adj = np.zeros((p, p), dtype=bool)
    for o in offsets:
        if o % p:
            adj[np.arange(p), (np.arange(p) - o) % p] = True
    return adj


def _exponents(p: int) -> list[int]:
    """The distinct offsets ``2^k mod p``, ``k = 0 .. ceil(log2 p) - 1`` (none for p = 1)."""
    return [1 << k for k in range(math.ceil(math.log2(p)))] if p > 1 else []


def _torus_shape(p: int) -> tuple[int, int]:
    rows = int(math.isqrt(p))
    while p % rows:
        rows -= 1
    return rows, p // rows


def ring(p: int, weights: str = "uniform") -> Topology:
    """The undirected ring: ``i`` with ``i - 1`` and ``i + 1`` (mod p). Uniform weights: gap
    ``2 (1 - cos(2 pi / p)) / 3``, about ``4 pi^2 / (3 p^2)``."""
    p = _check_p(p, "ring")
    return _weighted(f"ring({p})", _circulant(p, [1, -1]), weights)


def torus(p: int, weights: str = "uniform", *, shape: tuple[int, int] | None = None) -> Topology:
    """A 2-D torus of ``shape = (rows, cols)``, ``rows * cols == p`` (default: the squarest);
    rank ``r`` sits at ``(r // cols, r % cols)`` and talks to its four grid neighbors."""
    p = _check_p(p, "torus")
    rows, cols = _torus_shape(p) if shape is None else shape
    if not (isinstance(rows, (int, np.integer)) and isinstance(cols, (int, np.integer))
            and rows >= 1 and cols >= 1 and rows * cols == p):
        raise ValueError(f"torus: shape {shape!r} does not hold {p} ranks (rows * cols == p)")
    r, c = np.divmod(np.arange(p), cols)
    adj = np.zeros((p, p), dtype=bool)
    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        adj[np.arange(p), ((r + dr) % rows) * cols + (c + dc) % cols] = True
    np.fill_diagonal(adj, False)
    return _weighted(f"torus({rows}x{cols})", adj, weights)


def exponential(p: int, weights: str = "uniform") -> Topology:
    """The static exponential graph: ``i`` sends to ``i + 2^k`` (mod p) for every
    ``k < ceil(log2 p)`` (Assran et al. 2019); directed, ``ceil(log2 p)`` messages per rank."""
    p = _check_p(p, "exponential")
    return _weighted(f"exponential({p})", _circulant(p, _exponents(p)), weights)


def one_peer_exponential(p: int) -> Topology:
    """The one-peer exponential graph: at step ``t``, ``i`` sends to ``i + 2^k`` (mod p) with
    ``k = t mod ceil(log2 p)`` and keeps half: ``W_t = (I + S^(2^k)) / 2``; one message per
    rank per round (SGP, Assran et al. 2019). For ``p = 2^m`` the product over one period is
    ``J``: the exact average after ``m`` rounds."""
    p = _check_p(p, "one_peer_exponential")
    mats = [_uniform(_circulant(p, [o])) for o in _exponents(p)] or [np.ones((1, 1))]
    return Topology(f"one_peer_exponential({p})", mats)


def full(p: int) -> Topology:
    """Every rank with every rank, ``W = 11^T / p``: the average in one round (an allreduce
    built of ``p - 1`` messages per rank)."""
    p = _check_p(p, "full")
    return Topology(f"full({p})", [np.full((p, p), 1.0 / p)])


#: name -> builder(p, weights) of the graphs of the catalogue (``--sync gossip:NAME``)
GRAPHS: dict[str, Callable[..., Topology]] = {
    "ring": ring,
    "torus": torus,
    "exponential": exponential,
    "one_peer_exponential": lambda p, weights="uniform": one_peer_exponential(p),
    "full": lambda p, weights="uniform": full(p),
}
#: node-level graphs :func:`hierarchical` may join nodes with (undirected)
_NODE_GRAPHS = ("ring", "torus", "full")


def build(name: str, p: int, weights: str = "uniform") -> Topology:
    """The graph ``name`` of :data:`GRAPHS` over ``p`` ranks."""
    if not isinstance(name, str) or name not in GRAPHS:
        raise ValueError(f"unknown graph {name!r}; valid choices: {', '.join(GRAPHS)}")
    return GRAPHS[name](p, weights=weights)


def parse(spec: str, p: int) -> Topology:
    """``"NAME"`` or ``"NAME:WEIGHTS"`` (``"ring:metropolis"``) as a topology over ``p`` ranks."""
    name, _, weights = spec.partition(":")
    return build(name, p, weights or "uniform")


def hierarchical(node_ids: Sequence[int], inter: str = "ring") -> Topology:
    """The ranks of a node as one vertex: nodes joined by the undirected graph ``inter``
    ("ring", "torus" or "full") over the nodes in the order of their lowest rank.

    ``node_ids[r]`` names rank ``r``'s node (any label; ``collectives._runtime.nodes.node_ids``
    gives the lowest rank of each node). Every rank of node ``a`` takes the same weighted
    average: the mean of node ``a`` and of its neighbor nodes, with Metropolis-Hastings weights
    between nodes for the stationary distribution ``s_a / p`` (``s_a``: node ``a``'s rank count),
    ``V_ab = min(q_ab, q_ba s_b / s_a)`` with ``q_ab = 1 / (d_a + 1)``, spread evenly over the
    ranks of ``b``: ``W_ij = V_ab / s_b``. Detailed balance (``s_a V_ab = s_b V_ba``) makes
    ``W`` symmetric and so doubly stochastic even when nodes differ in size.
    """
    ids = list(node_ids)
    p = _check_p(len(ids), "hierarchical")
    if inter not in _NODE_GRAPHS:
        raise ValueError(f"hierarchical: unknown node graph {inter!r}; valid choices: "
                         f"{', '.join(_NODE_GRAPHS)}")
    labels = list(dict.fromkeys(ids))  # nodes in the order of their first (lowest) rank
    node = np.array([labels.index(v) for v in ids])
    m = len(labels)
    s = np.bincount(node, minlength=m).astype(np.float64)
    adj = build(inter, m).weights() != 0
    np.fill_diagonal(adj, False)
    q = 1.0 / (adj.sum(axis=1) + 1.0)
    v = np.where(adj, np.minimum(q[:, None], q[None, :] * s[None, :] / s[:, None]), 0.0)
    np.fill_diagonal(v, 1.0 - v.sum(axis=1))
    w = v[node][:, node] / s[node][None, :]
    return Topology(f"hierarchical({m} nodes of {'/'.join(str(int(k)) for k in s)}, {inter})",
                    [w])


def hierarchical_for(comm: Any, inter: str = "ring", node_size: int | None = None) -> Topology:
    """:func:`hierarchical` over the nodes of ``comm`` (collective; MPI collectives only): the
    shared-memory nodes, or emulated nodes of ``node_size`` ranks (``Options.node_size``)."""
    from .._runtime.nodes import node_ids

    return hierarchical(node_ids(comm, node_size), inter)


def from_adjacency(adjacency: np.ndarray, weights: str = "metropolis",
                   name: str = "custom") -> Topology:
    """A user's graph: ``adjacency[i, j] != 0`` when rank ``i`` receives from rank ``j`` (the
    diagonal is ignored), weighted by ``weights`` ("metropolis" needs it symmetric)."""
    a = np.asarray(adjacency)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
        raise ValueError(f"{name}: adjacency must be square (p x p), got shape {a.shape}")
    return _weighted(f"{name}({a.shape[0]})", a != 0, weights)


def from_weights(weights: np.ndarray | Sequence[np.ndarray], name: str = "custom") -> Topology:
    """A user's mixing matrix (row ``i``: what rank ``i`` gives itself and its in-neighbors),
    or a list of them, one per step of a period. Checked as :class:`Topology` checks."""
    a = np.asarray(weights, dtype=np.float64)
    if a.ndim not in (2, 3):
        raise ValueError(f"{name}: weights must be a p x p matrix or a list of them, got shape "
                         f"{a.shape}")
    return Topology(f"{name}({a.shape[-1]})", [a] if a.ndim == 2 else list(a))
