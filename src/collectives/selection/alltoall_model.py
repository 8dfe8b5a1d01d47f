"""The alpha-beta cost model of every alltoall algorithm, on one level or two.

The notation of :mod:`.cost_model` (whose :class:`~.cost_model.Network` and per-step crossing
patterns this module uses): ``b`` bytes per block, ``p`` ranks, ``alpha`` seconds per message
and ``beta`` seconds per byte sent; a local copy (packing, rotating, landing) costs ``gamma``
per byte, one pass over memory as a reduction's. A step moves the same bytes between several
pairs at once and lasts as long as its slowest part (``cost_model._step``: on two levels the
pairs that cross a node's link share it). One function per algorithm, in :data:`COSTS`:

- pairwise: ``p - 1`` steps of one block each, partner ``r XOR k`` (p a power of two) or
  ``r + k``: ``(p-1) (alpha + b beta)`` on one level;
- bruck: ``ceil(lg p)`` steps, step ``k`` sending the ``c_k`` blocks whose index has bit ``k``
  set (``c_k`` about ``p/2``) to rank ``r + 2^k``, packed and unpacked, after a rotation of all
  ``p`` blocks and before the inverse one: ``sum_k (alpha + c_k b beta) + (2 p + 2 sum_k c_k)
  b gamma``;
- native: what MPICH runs (Bruck up to :data:`NATIVE_SHORT_BLOCK` bytes per block, pairwise
  above) with ``alpha_native`` per message, plus the copy of the landing buffer (``p b gamma``:
  under the failure guard native receives into a buffer of its own, ``blocks/native.py``);
- hierarchical: with nodes of ``m`` ranks (``N`` of them), the leader receives the node's
  ``m - 1`` inputs (``p b`` each, one after the other), packs ``m p b`` bytes, exchanges one
  message of ``m^2 b`` with each other leader (``N - 1`` steps, one flow per link), assembles and
  sends ``m - 1`` results of ``p b``: ``2 (m-1) (alpha + p b beta) + (N-1) (alpha_inter + m^2 b
  beta_inter) + 2 m p b gamma``. On one node it is pairwise (``blocks/node_aware.py``).

The formulas read the network and the block size only, so every rank of a communicator that
has the same parameters (read on rank 0 and broadcast: :mod:`.network`) computes the same
times and picks the same algorithm. ``blocks/auto.py`` chooses by :func:`best`.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

from .cost_model import Network, _m, _or, _pattern, _step

__all__ = ["COSTS", "NATIVE_SHORT_BLOCK", "predict", "predict_all", "best", "ONE_NODE",
           "ACROSS_NODES"]

#: MPICH's short-message threshold of alltoall (``MPIR_CVAR_ALLTOALL_SHORT_MSG_SIZE``): Bruck
#: up to here, bytes per block.
NATIVE_SHORT_BLOCK = 256
#: What "auto" chooses among on one node, and across nodes: not "hierarchical", whose formula
#: (the bytes and messages of its three phases) predicts it fastest up to 16 KiB per block on
#: 2 x 2 and 2 x 4 ranks with the built-in parameters, where it measured 1.2-5.7x slower than
#: pairwise on the emulated cluster (its phases run one after another, driven from Python,
#: which no per-message alpha sees: docs/benchmarks/alltoall.md)
ONE_NODE = ("pairwise", "bruck", "native")
ACROSS_NODES = ONE_NODE


def _partners(p: int, k: int) -> list[tuple[int, int]]:
    """Who sends to whom in pairwise's round ``k``: ``r XOR k`` or ``r + k``."""
    if p & (p - 1) == 0:
        return [(r, r ^ k) for r in range(p)]
    return [(r, (r + k) % p) for r in range(p)]


def _bruck_rounds(p: int) -> list[tuple[int, int]]:
    """``(2^k, c_k)`` of every Bruck round: the distance and the blocks it sends."""
    return [(1 << k, sum(1 for i in range(p) if i & (1 << k)))
            for k in range(max(p - 1, 0).bit_length())]


def pairwise(b: float, p: int, net: Network, alpha: float | None = None) -> float:
    m = _m(p, net)
    return sum(_step(b, _pattern(_partners(p, k), m), net, alpha) for k in range(1, p))


def bruck(b: float, p: int, net: Network, alpha: float | None = None) -> float:
    m = _m(p, net)
    rounds = _bruck_rounds(p)
    steps = sum(_step(c * b, _pattern([(r, (r + d) % p) for r in range(p)], m), net, alpha)
                for d, c in rounds)
    return steps + (2 * p + 2 * sum(c for _, c in rounds)) * b * net.gamma


def native(b: float, p: int, net: Network) -> float:
    a = _or(net.alpha_native, net.alpha)
    schedule = bruck if b <= NATIVE_SHORT_BLOCK else pairwise
    return schedule(b, p, net, a) + p * b * net.gamma


def hierarchical(b: float, p: int, net: Network) -> float:
    m = _m(p, net)
    nodes = math.ceil(p / m)
    if nodes == 1 or m == 1:
        return pairwise(b, p, net)
    intra = 2 * (m - 1) * (net.alpha + p * b * net.beta)
    across = (nodes - 1) * (_or(net.alpha_inter, net.alpha)
                            + m * m * b * _or(net.beta_inter, net.beta))
    return intra + across + 2 * m * p * b * net.gamma


#: Predicted seconds of each alltoall algorithm: ``COSTS[name](bytes_per_block, p, network)``.
COSTS: dict[str, Callable[[float, int, Network], float]] = {
    "pairwise": pairwise,
    "bruck": bruck,
    "native": native,
    "hierarchical": hierarchical,
}


def predict(name: str, b: float, p: int, net: Network) -> float:
    """Predicted seconds of alltoall ``name`` for ``b`` bytes per block on ``p`` ranks."""
    if name not in COSTS:
        raise ValueError(f"no alltoall cost model for {name!r}; valid choices: "
                         f"{', '.join(COSTS)}")
    return COSTS[name](b, p, net)


def predict_all(b: float, p: int, net: Network,
                names: Iterable[str] = tuple(COSTS)) -> dict[str, float]:
    """:func:`predict` for every name of ``names``."""
    return {name: predict(name, b, p, net) for name in names}


def best(b: float, p: int, net: Network, names: Iterable[str] = ONE_NODE) -> str:
    """The name of ``names`` with the smallest predicted time (the first wins ties)."""
    times = predict_all(b, p, net, names)
    return min(times, key=times.__getitem__)
