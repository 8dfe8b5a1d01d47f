"""The alpha-beta-gamma cost model of every allreduce algorithm (docs/algorithms.md).

(``collectives.tuning.cost_model``; was ``collectives.model``.)

Notation (Thakur, Rabenseifner & Gropp, *Optimization of Collective Communication Operations in
MPICH*, 2005): ``n`` bytes per rank, ``p`` ranks, ``alpha`` seconds per message, ``beta`` seconds
per byte sent, ``gamma`` seconds per byte reduced; ``pof2`` the largest power of two <= p,
``rem = p - pof2``, ``lg`` the base-2 logarithm. One function per algorithm, in :data:`COSTS`:

- ring: blocks of ``n/p`` bytes, each cut into ``s = ceil((n/p) / segment)`` segments;
  ``2 (p-1) s alpha + 2 n (p-1)/p beta + n (p-1)/p gamma``.
- tree: ``s = ceil(n / segment)`` segments through ``L = ceil(lg p)`` levels, pipelined;
  ``(L + s - 1) (2 alpha + 2 (n/s) beta + (n/s) gamma)`` (``s = 1``: the textbook
  ``2 lg p alpha + 2 n lg p beta + n lg p gamma``).
- recursive_doubling: ``lg pof2 (alpha + n beta + n gamma)`` plus the fold.
- rabenseifner: ``2 lg pof2 alpha + 2 n (pof2-1)/pof2 beta + n (pof2-1)/pof2 gamma`` plus fold.
- fold, when ``rem > 0``: ``2 alpha + 2 n beta + n gamma``.
- hierarchical: nodes of ``m`` ranks (``node_size``; one node when None), ``N`` nodes: ring
  inside the node (intra parameters), the flat ``inter_algorithm`` on ``n/m`` bytes across the
  ``N`` nodes (inter parameters), plus ``2 (alpha + n beta) + n gamma`` on nodes with extras.
- native: MPICH's own choice, recursive doubling up to 2 KiB and Rabenseifner above, costed with
  ``alpha_native`` (MPI's C path pays no Python per message).

On one machine the inter-node parameters equal the intra-node ones (the defaults).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from ..algorithms.pof2 import pof2_of

__all__ = ["Network", "COSTS", "predict", "predict_all", "best", "NATIVE_SHORT_BYTES"]

#: MPICH's classic short-message threshold (recursive doubling up to here, Rabenseifner above).
NATIVE_SHORT_BYTES = 2048


@dataclass(frozen=True)
class Network:
    """Model parameters (seconds, seconds per byte) and the algorithm settings that matter."""

    alpha: float
    beta: float
    gamma: float
    alpha_native: float | None = None
    alpha_inter: float | None = None
    beta_inter: float | None = None
    segment_bytes: int = 1 << 20
    node_size: int | None = None
    inter_algorithm: str = "ring"

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "gamma", "alpha_native", "alpha_inter", "beta_inter"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {self.segment_bytes!r}")

    def inter(self) -> "Network":
        """The parameters across nodes (equal to these on one machine)."""
        return replace(self, alpha=_or(self.alpha_inter, self.alpha),
                       beta=_or(self.beta_inter, self.beta), node_size=None)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _lg(p: int) -> int:
    return max(p - 1, 0).bit_length()  # ceil(log2 p)


def _fold(n: float, p: int, net: Network, alpha: float) -> float:
    return 0.0 if p == pof2_of(p) else 2 * alpha + 2 * n * net.beta + n * net.gamma


def ring(n: float, p: int, net: Network) -> float:
    if p < 2:
        return 0.0
    s = max(1, math.ceil(n / p / net.segment_bytes))
    share = n * (p - 1) / p
    return 2 * (p - 1) * s * net.alpha + 2 * share * net.beta + share * net.gamma


def tree(n: float, p: int, net: Network) -> float:
    if p < 2:
        return 0.0
    s = max(1, math.ceil(n / net.segment_bytes))
    seg = n / s
    return (_lg(p) + s - 1) * (2 * net.alpha + 2 * seg * net.beta + seg * net.gamma)


def recursive_doubling(n: float, p: int, net: Network, alpha: float | None = None) -> float:
    a = net.alpha if alpha is None else alpha
    steps = pof2_of(p).bit_length() - 1
    return steps * (a + n * net.beta + n * net.gamma) + _fold(n, p, net, a)


def rabenseifner(n: float, p: int, net: Network, alpha: float | None = None) -> float:
    a = net.alpha if alpha is None else alpha
    pof2 = pof2_of(p)
    share = n * (pof2 - 1) / pof2
    steps = pof2.bit_length() - 1
    return 2 * steps * a + 2 * share * net.beta + share * net.gamma + _fold(n, p, net, a)


def native(n: float, p: int, net: Network) -> float:
    a = _or(net.alpha_native, net.alpha)
    if n <= NATIVE_SHORT_BYTES:
        return recursive_doubling(n, p, net, a)
    return rabenseifner(n, p, net, a)


def hierarchical(n: float, p: int, net: Network) -> float:
    m = p if net.node_size is None else min(net.node_size, p)
    nodes = math.ceil(p / m)
    smallest = p - (nodes - 1) * m
    positions = min(m, smallest)
    cost = ring(n, positions, net)
    if positions < m:  # nodes with extras send to and receive from a position holder
        cost += 2 * (net.alpha + n * net.beta) + n * net.gamma
    if nodes > 1:
        cost += COSTS[net.inter_algorithm](n / positions, nodes, net.inter())
    return cost


#: Predicted seconds of each algorithm: ``COSTS[name](n_bytes, p, network)``.
COSTS: dict[str, Callable[[float, int, Network], float]] = {
    "ring": ring,
    "tree": tree,
    "recursive_doubling": recursive_doubling,
    "rabenseifner": rabenseifner,
    "hierarchical": hierarchical,
    "native": native,
}


def predict(name: str, n: float, p: int, net: Network) -> float:
    """Predicted seconds of algorithm ``name`` for ``n`` bytes per rank on ``p`` ranks."""
    if name not in COSTS:
        raise ValueError(f"no cost model for {name!r}; valid choices: {', '.join(COSTS)}")
    return COSTS[name](n, p, net)


def predict_all(n: float, p: int, net: Network,
                names: Iterable[str] = tuple(COSTS)) -> dict[str, float]:
    """:func:`predict` for every name of ``names``."""
    return {name: predict(name, n, p, net) for name in names}


def best(n: float, p: int, net: Network, names: Iterable[str] = tuple(COSTS)) -> str:
    """The name of ``names`` with the smallest predicted time (first wins ties)."""
    times = predict_all(n, p, net, names)
    return min(times, key=times.__getitem__)
