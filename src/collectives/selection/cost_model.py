"""The alpha-beta-gamma cost model of every allreduce algorithm, on one level or two.

Notation (Thakur, Rabenseifner & Gropp, *Optimization of Collective Communication Operations in
MPICH*, 2005): ``n`` bytes per rank, ``p`` ranks, ``alpha`` seconds per message, ``beta`` seconds
per byte sent, ``gamma`` seconds per byte reduced; ``pof2`` the largest power of two <= p,
``rem = p - pof2``, ``lg`` the base-2 logarithm. One function per algorithm, in :data:`COSTS`.

**One level** (one machine, or every rank its own node): every message costs
``alpha + bytes beta``, which gives the textbook forms:

- ring: blocks of ``n/p`` bytes, each cut into ``s = ceil((n/p) / segment)`` segments;
  ``2 (p-1) s alpha + 2 n (p-1)/p beta + n (p-1)/p gamma``.
- tree: ``s = ceil(n / segment)`` segments through ``L = ceil(lg p)`` levels, pipelined;
  ``(L + s - 1) (2 alpha + 2 (n/s) beta + (n/s) gamma)`` (``s = 1``: the textbook
  ``2 lg p alpha + 2 n lg p beta + n lg p gamma``).
- recursive_doubling: ``lg pof2 (alpha + n beta + n gamma)`` plus the fold.
- rabenseifner: ``2 lg pof2 alpha + 2 n (pof2-1)/pof2 beta + n (pof2-1)/pof2 gamma`` plus fold.
- fold, when ``rem > 0``: ``2 alpha + 2 n beta + n gamma``.
- native: MPICH's own choice, recursive doubling up to 2 KiB and Rabenseifner above, costed with
  ``alpha_native`` (MPI's C path pays no Python per message).

**Two levels** (a cluster: ``node_size`` ranks per node, placed node by node as ``mpiexec
-hosts a:m,b:m`` places them, and ``alpha_inter``/``beta_inter`` given): a message between ranks
of one node costs ``alpha + bytes beta`` (shared memory); between nodes ``alpha_inter + bytes
beta_inter``, where ``beta_inter`` is what *one* flow gets from a node's link. The ranks of a node
share its link: in a step where ``f`` of a node's ranks send to other nodes at once, the link
carries ``f x bytes``. Every algorithm is a sequence of steps (the same partners as the code:
``algorithms/pof2.py``, ``blocks/binomial.py``, the ring's neighbours), and a step lasts as long as
its slowest part::

    step(bytes) = max(alpha + bytes beta                  if any pair is inside a node,
                      alpha_inter + f bytes beta_inter    if any pair crosses nodes)

with ``f`` the largest number of pairs that cross one node's link in one direction in that step
(a link is shaped both ways: what a node sends and what it receives). So a ring crosses with
one flow per node (``2 (p-1)`` steps of ``n/p``); recursive doubling and Rabenseifner's halving
steps with distance ``>= node_size`` cross with every rank of the node at once (Rabenseifner's
first, largest step is one of them); the tree's levels overlap when pipelined, so all of a node's
crossing tree edges share its link in every stage (a parent's node receives from every child
on another node at once).

- hierarchical: nodes of ``m`` ranks, ``N`` nodes, ``k = min(m, smallest node)`` positions: a
  ring inside the node over ``k`` ranks (intra parameters), then the flat ``inter_algorithm`` on
  ``n/k`` bytes across the ``N`` nodes, whose ``k`` copies (one per position) run at once and
  share each node's link (``beta_inter x k``; on one level, ``beta``), plus
  ``2 (alpha + n beta) + n gamma`` on nodes with extras. With ring across, the link carries
  ``2 n (N-1)/N``: the least any allreduce can send off a node.

Without ``node_size`` (or without inter parameters) the model is one level; with ``node_size``
but no inter parameters, ``hierarchical`` is costed on one level (emulated nodes on one machine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

from .._runtime.ranks import pof2_of, real_rank
from .names import FLAT_NAMES
from .tuning_file import read_entries

__all__ = ["Network", "COSTS", "predict", "predict_all", "best", "from_tuning_file",
           "allgather", "NATIVE_SHORT_BYTES"]

#: MPICH's classic short-message threshold (recursive doubling up to here, Rabenseifner above).
NATIVE_SHORT_BYTES = 2048


@dataclass(frozen=True)
class Network:
    """Model parameters (seconds, seconds per byte) and the algorithm settings that matter.

    ``alpha``/``beta`` are the intra-node parameters (the only ones on one level),
    ``alpha_inter``/``beta_inter`` those of one flow between nodes, ``node_size`` the ranks per
    node: with it and an inter parameter the model has two levels (the module docstring).
    """

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
        if self.node_size is not None and self.node_size < 1:
            raise ValueError(f"node_size must be >= 1 or None, got {self.node_size!r}")
        if self.inter_algorithm not in FLAT_NAMES:
            raise ValueError(f"inter_algorithm must be one of {', '.join(FLAT_NAMES)}, got "
                             f"{self.inter_algorithm!r}")

    @property
    def two_level(self) -> bool:
        """Whether messages between nodes have parameters of their own."""
        return self.node_size is not None and (self.alpha_inter is not None
                                               or self.beta_inter is not None)

    def intra(self) -> "Network":
        """One level with the inside-node parameters."""
        return replace(self, node_size=None, alpha_inter=None, beta_inter=None)

    def inter(self, flows: int = 1) -> "Network":
        """One level with the parameters across nodes, ``flows`` flows sharing each link
        (equal to the inside-node ones when there are no inter parameters)."""
        return replace(self, alpha=_or(self.alpha_inter, self.alpha),
                       beta=_or(self.beta_inter, self.beta) * flows, node_size=None,
                       alpha_inter=None, beta_inter=None)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _lg(p: int) -> int:
    return max(p - 1, 0).bit_length()  # ceil(log2 p)


# ------------------------------------------------------------------ who crosses nodes, per step
# A step's *pattern* is (f, intra): the largest number of pairs that cross one node's link in one
# direction (sending out of the node, or receiving into it: a link is shaped both ways), and
# whether any pair is inside a node. Ranks are placed node by node: rank r is on node r // m.
# Patterns depend on (p, m) only and are cached.
Pattern = tuple[int, bool]


def _pattern(pairs: Iterable[tuple[int, int]], m: int) -> Pattern:
    out: dict[int, int] = {}
    into: dict[int, int] = {}
    intra = False
    for r, q in pairs:  # r sends to q
        if r // m == q // m:
            intra = True
        else:
            out[r // m] = out.get(r // m, 0) + 1
            into[q // m] = into.get(q // m, 0) + 1
    return max([*out.values(), *into.values(), 0]), intra


@lru_cache(maxsize=4096)
def _xor_patterns(p: int, m: int, reverse: bool) -> tuple[Pattern, ...]:
    """Patterns of the power-of-two steps, mask = 1, 2, ... (``reverse``: pof2/2, ..., 1)."""
    pof2, rem = pof2_of(p), p - pof2_of(p)
    masks = [1 << k for k in range(pof2.bit_length() - 1)]
    return tuple(_pattern(((real_rank(v, rem), real_rank(v ^ mask, rem)) for v in range(pof2)), m)
                 for mask in (reversed(masks) if reverse else masks))


@lru_cache(maxsize=4096)
def _fold_pattern(p: int, m: int) -> Pattern:
    rem = p - pof2_of(p)
    return _pattern(((r, r + 1) for r in range(0, 2 * rem, 2)), m)


@lru_cache(maxsize=4096)
def _tree_pattern(p: int, m: int) -> Pattern:
    """Every child-to-parent edge of the binomial tree at once (the pipeline's steady state; the
    broadcast sends the same edges the other way, so the busier direction decides both)."""
    return _pattern(((v, v - (v & -v)) for v in range(1, p)), m)


def _ring_pattern(p: int, m: int) -> Pattern:
    return (1 if p > m else 0), m > 1


def _step(nbytes: float, pattern: Pattern, net: Network, alpha: float | None = None) -> float:
    """Seconds of one step moving ``nbytes`` per pair with this crossing pattern."""
    a = net.alpha if alpha is None else alpha
    if not net.two_level or net.node_size is None:
        return a + nbytes * net.beta
    flows, intra = pattern
    t = a + nbytes * net.beta if intra else 0.0
    if flows:
        t = max(t, _or(net.alpha_inter, a) + flows * nbytes * _or(net.beta_inter, net.beta))
    return t


def _m(p: int, net: Network) -> int:
    return p if net.node_size is None else min(net.node_size, p)


def _fold(n: float, p: int, net: Network, alpha: float) -> float:
    if p == pof2_of(p):
        return 0.0
    return 2 * _step(n, _fold_pattern(p, _m(p, net)), net, alpha) + n * net.gamma


def ring(n: float, p: int, net: Network) -> float:
    if p < 2:
        return 0.0
    s = max(1, math.ceil(n / p / net.segment_bytes))
    share = n * (p - 1) / p
    step = _step(n / p / s, _ring_pattern(p, _m(p, net)), net)
    return 2 * (p - 1) * s * step + share * net.gamma


def tree(n: float, p: int, net: Network) -> float:
    if p < 2:
        return 0.0
    s = max(1, math.ceil(n / net.segment_bytes))
    seg = n / s
    return (_lg(p) + s - 1) * (2 * _step(seg, _tree_pattern(p, _m(p, net)), net)
                               + seg * net.gamma)


def recursive_doubling(n: float, p: int, net: Network, alpha: float | None = None) -> float:
    a = net.alpha if alpha is None else alpha
    steps = _xor_patterns(p, _m(p, net), False)
    return (sum(_step(n, pat, net, a) for pat in steps) + len(steps) * n * net.gamma
            + _fold(n, p, net, a))


def rabenseifner(n: float, p: int, net: Network, alpha: float | None = None) -> float:
    a = net.alpha if alpha is None else alpha
    pof2 = pof2_of(p)
    cost = 0.0
    mask = pof2 >> 1
    for pat in _xor_patterns(p, _m(p, net), True):  # halving: the half given is n mask/pof2
        half = n * mask / pof2
        cost += 2 * _step(half, pat, net, a) + half * net.gamma  # reduce-scatter + allgather
        mask >>= 1
    return cost + _fold(n, p, net, a)


def native(n: float, p: int, net: Network) -> float:
    a = _or(net.alpha_native, net.alpha)
    if n <= NATIVE_SHORT_BYTES:
        return recursive_doubling(n, p, net, a)
    return rabenseifner(n, p, net, a)


def hierarchical(n: float, p: int, net: Network) -> float:
    m = _m(p, net)
    nodes = math.ceil(p / m)
    smallest = p - (nodes - 1) * m
    positions = min(m, smallest)
    intra = net.intra()
    cost = ring(n, positions, intra)
    if positions < m:  # nodes with extras send to and receive from a position holder
        cost += 2 * (net.alpha + n * net.beta) + n * net.gamma
    if nodes > 1:
        across = net.inter(positions if net.two_level else 1)
        cost += COSTS[net.inter_algorithm](n / positions, nodes, across)
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


def allgather(n: float, p: int, net: Network) -> float:
    """A ring allgather of ``n`` bytes from each rank, sizes first (what the compressed
    strategies' variable-size exchange does): ``(p-1) (step(8) + step(n))``, one flow per node's
    link. Also the model of the sparse strategies, which move about as much."""
    if p < 2:
        return 0.0
    pattern = _ring_pattern(p, _m(p, net))
    return (p - 1) * (_step(8, pattern, net) + _step(n, pattern, net))


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


def from_tuning_file(path: str | Path, p: int | None = None) -> Network:
    """The fitted :class:`Network` the tuning file ``path`` stores for world size ``p`` (None:
    the first world size whose model has two levels, else the first with a model).

    Raises
    ------
    ValueError
        If the file has no fitted model for ``p`` (or none at all), or is not a tuning file
        (:class:`~collectives.selection.tuning_file.TuningFileError`).
    """
    models = {k: e.model for k, e in read_entries(path).items() if e.model}
    if p is None:
        two = [k for k, m in models.items() if m.get("alpha_inter") is not None]
        p = (two or list(models) or [None])[0]
    if p not in models:
        raise ValueError(f"{path}: no fitted model" + (f" for world size {p}" if p else ""))
    return Network(**models[p])
