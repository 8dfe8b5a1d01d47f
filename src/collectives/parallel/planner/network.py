"""The planner's network: two levels (inside a host, between hosts) and where each mesh axis runs.

A :class:`Cluster` is ``hosts`` hosts of ``ranks // hosts`` ranks each and one
:class:`~collectives.selection.cost_model.Network` (intra-node ``alpha``/``beta``/``gamma``;
``alpha_inter``/``beta_inter`` of one flow between hosts). Where its parameters come from
(:func:`cluster`):

- ``tuning``: the fitted model of a tuning file (``collectives-tune``; for the world size
  ``ranks`` when the file has it, else its first two-level model, else its first);
- otherwise the inside-node parameters of
  :data:`collectives.selection.network.CLUSTER_DEFAULTS` (fitted on one node of this machine,
  docs/benchmarks.md) and its 25 us per message between hosts;
- ``rate`` (``--network 1gbit|10gbit|<rate>``, :func:`parse_rate`) sets ``beta_inter = 8 /
  rate`` seconds per byte, over what the tuning file says;
- ``measured``: the links measured inside the launch (``--calibrate``,
  :mod:`collectives.plan.calibrate`), over all of the above.

Placement: ranks fill host 0 first, then host 1, ... (``mpiexec -hosts a:m,b:m``). The mesh
coordinates of rank ``r`` are ``(d, s, t)`` with ``r = (d pp + s) tp + t``: tensor parallelism
innermost, then pipeline, then data (Megatron-LM's order), so the groups of the innermost axes
stay inside a host as long as they fit. :func:`group_network` gives the cost-model network of one
axis's groups: inside one host, the intra parameters; across hosts, two levels with
``node_size`` the group's ranks per host and ``beta_inter`` times the number of that axis's groups
whose rings leave the same host at once (they share its link, as the two-level model of
:mod:`collectives.selection.cost_model` has a node's flows share it). :func:`p2p_seconds` prices
the pipeline's neighbor messages the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from ...selection.cost_model import Network, from_tuning_file
from ...selection.network import CLUSTER_DEFAULTS
from ...selection.tuning_file import read_entries

__all__ = ["Cluster", "cluster", "parse_rate", "RATE_UNITS", "DEFAULT_ALPHA_INTER",
           "mesh_rank", "axis_groups", "group_network", "p2p_seconds"]

#: ``--network`` units, bits per second (those of ``tc``: ``1gbit``, ``100mbit``).
RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
#: Seconds per message between hosts when no tuning file gives one (CLUSTER_DEFAULTS' TCP).
DEFAULT_ALPHA_INTER = CLUSTER_DEFAULTS["alpha_inter"]
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_rate(text: str) -> float:
    """Bits per second of ``text``: a number and a unit of :data:`RATE_UNITS` ("1gbit",
    "2.5gbit", "100mbit"); raises ValueError naming the forms."""
    match = _RATE.match(text or "")
    unit = match.group(2).lower() if match else ""
    if not match or unit not in RATE_UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"cannot read the network rate {text!r}: expected a positive number "
                         f"and one of the units {', '.join(RATE_UNITS)}, e.g. 1gbit, 10gbit, "
                         f"100mbit")
    return float(match.group(1)) * RATE_UNITS[unit]


@dataclass(frozen=True)
class Cluster:
    """``hosts`` hosts of ``ranks // hosts`` ranks; ``net`` the cost-model parameters (its
    inter parameters are used only where a group crosses hosts); ``source`` says where they
    came from."""

    ranks: int
    hosts: int
    net: Network
    source: str

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {self.ranks}")
        if self.hosts < 1 or self.ranks % self.hosts:
            raise ValueError(f"--hosts {self.hosts} must be >= 1 and divide the {self.ranks} "
                             f"ranks (each host runs the same number of ranks)")
        if self.hosts > 1 and (self.net.alpha_inter is None or self.net.beta_inter is None):
            raise ValueError("more than one host needs the network between them: give "
                             "--network RATE or a tuning file with a two-level model")

    @property
    def per_host(self) -> int:
        return self.ranks // self.hosts

    def host(self, rank: int) -> int:
        return rank // self.per_host


def _fitted(path: str | Path, ranks: int) -> dict:
    """The tuning file's model for ``ranks``, else as :func:`from_tuning_file` picks one."""
    models = {p: e.model for p, e in read_entries(path).items() if e.model}
    if ranks in models:
        fields = dict(models[ranks])
        Network(**fields)  # checks the fields
        return fields
    net = from_tuning_file(path)
    return {k: getattr(net, k) for k in ("alpha", "beta", "gamma", "alpha_native",
                                         "alpha_inter", "beta_inter", "segment_bytes")}


def cluster(ranks: int, hosts: int = 1, rate: str | None = None,
            tuning: str | Path | None = None, measured: dict | None = None) -> Cluster:
    """The :class:`Cluster` of these arguments (the module docstring says where each parameter
    comes from; ``measured``: ``alpha``, ``beta``, ``alpha_inter``, ``beta_inter`` measured
    inside the launch, over all of them); raises ValueError for bad values."""
    if ranks < 1:
        raise ValueError(f"--ranks must be >= 1, got {ranks}")
    if tuning is not None:
        fields, source = _fitted(tuning, ranks), f"tuning file {tuning}"
    else:
        fields, source = dict(CLUSTER_DEFAULTS), "built-in CLUSTER_DEFAULTS (intra fitted here)"
    fields.pop("node_size", None)
    if rate is not None:
        fields["beta_inter"] = 8.0 / parse_rate(rate)
        if fields.get("alpha_inter") is None:
            fields["alpha_inter"] = DEFAULT_ALPHA_INTER
        source += f", {rate} between hosts"
    if measured:
        fields.update({k: float(v) for k, v in measured.items()
                       if k in ("alpha", "beta", "alpha_inter", "beta_inter")})
        source += f"; {', '.join(sorted(measured))} measured inside the launch"
    return Cluster(ranks, hosts, Network(**fields), source)


def mesh_rank(d: int, s: int, t: int, pp: int, tp: int) -> int:
    """The rank of mesh coordinates ``(d, s, t)`` (tp innermost, then pp, then dp)."""
    return (d * pp + s) * tp + t


def axis_groups(axis: str, dp: int, pp: int, tp: int) -> list[list[int]]:
    """Every group of ``axis`` ("dp", "pp" or "tp"): the ranks of each, in axis order."""
    sizes = {"dp": dp, "pp": pp, "tp": tp}
    if axis not in sizes:
        raise ValueError(f"axis must be one of dp, pp, tp, got {axis!r}")
    others = [a for a in ("dp", "pp", "tp") if a != axis]
    groups = []
    for i in range(sizes[others[0]]):
        for j in range(sizes[others[1]]):
            group = []
            for k in range(sizes[axis]):
                c = {others[0]: i, others[1]: j, axis: k}
                group.append(mesh_rank(c["dp"], c["pp"], c["tp"], pp, tp))
            groups.append(group)
    return groups


def group_network(c: Cluster, groups: list[list[int]]) -> Network:
    """The cost-model network one of ``groups`` (the groups of one axis, all busy at once) runs
    on: one level inside a host; two levels across hosts, with ``node_size`` the most ranks a
    group has on one host and ``beta_inter`` scaled by the most crossing groups on one host."""
    crossing = [g for g in groups if len({c.host(r) for r in g}) > 1]
    if not crossing:
        return c.net.intra()
    per_host = max(max(sum(1 for r in g if c.host(r) == h) for h in {c.host(r) for r in g})
                   for g in crossing)
    sharing = max(sum(1 for g in crossing if any(c.host(r) == h for r in g))
                  for h in range(c.hosts))
    return replace(c.net, node_size=per_host, beta_inter=c.net.beta_inter * sharing)


def p2p_seconds(c: Cluster, pairs: list[tuple[int, int]], nbytes: float) -> float:
    """Seconds of one message of ``nbytes`` on each of ``pairs`` (sender, receiver) at once:
    ``alpha + nbytes beta`` inside a host; across hosts ``alpha_inter + f nbytes beta_inter``
    with ``f`` the most pairs leaving (or entering) one host; the slower of the two."""
    net = c.net
    out: dict[int, int] = {}
    into: dict[int, int] = {}
    intra = False
    for a, b in pairs:
        if c.host(a) == c.host(b):
            intra = True
        else:
            out[c.host(a)] = out.get(c.host(a), 0) + 1
            into[c.host(b)] = into.get(c.host(b), 0) + 1
    t = net.alpha + nbytes * net.beta if intra else 0.0
    flows = max([*out.values(), *into.values(), 0])
    if flows:
        t = max(t, net.alpha_inter + flows * nbytes * net.beta_inter)
    return t
