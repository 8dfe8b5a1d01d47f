"""``collectives-project`` / ``python -m collectives.tools.tuning.projection``: which algorithm wins at scale.

Evaluates the cost model (:mod:`collectives.selection.cost_model`) of every hand-written allreduce
for 16 to 4096 ranks on a network you describe, and prints, for each world size and message size,
the winner and every algorithm's predicted time relative to it. ``--gamma`` is the local reduction
cost. Without ``--node-size`` every rank is its own node: all messages cross the network
(``--alpha``, ``--beta``). With ``--node-size M`` the model has two levels: nodes of M ranks, placed
node by node, talk inside over ``--alpha-intra``/``--beta-intra`` (shared memory) and across over
the network, where the ranks of a node share its link; every algorithm is costed so, and
"hierarchical" (rings inside nodes, ``--inter-algorithm`` across) is added. ``--model TUNING.json``
takes all parameters from a tuning file instead, as ``collectives-tune`` fitted them (on a cluster:
two levels and its node size; ``--node-size`` still overrides the node size). "native" is left out:
its model is MPICH's own choice between recursive doubling and Rabenseifner.

Defaults describe 10 Gbit/s Ethernet (alpha 5 us, beta 0.8 ns/B) and a 10 GB/s reduction.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Sequence, TextIO

from ..._runtime.cli import program
from ...selection.cost_model import Network, from_tuning_file, predict
from ...selection.names import FLAT_NAMES as _ALL_FLAT

__all__ = ["project", "format_table", "main", "script"]

DEFAULT_RANKS = [16, 64, 256, 1024, 4096]
DEFAULT_SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
#: the hand-written flat algorithms (MPI's own "native" is not projected)
FLAT_NAMES = [name for name in _ALL_FLAT if name != "native"]


def project(ranks: Sequence[int], sizes: Sequence[int], net: Network,
            intra: Network | None = None) -> dict[tuple[int, int], dict[str, float]]:
    """Predicted seconds by (p, size) and algorithm; "hierarchical" on two levels.

    ``net``: the network; ``intra``: the inside-node parameters with their ``node_size``, which
    make the model two-level (``net`` across nodes); or ``net`` may already be two-level.
    """
    if intra is not None:
        net = Network(alpha=intra.alpha, beta=intra.beta, gamma=net.gamma,
                      alpha_inter=net.alpha, beta_inter=net.beta,
                      segment_bytes=net.segment_bytes, node_size=intra.node_size,
                      inter_algorithm=intra.inter_algorithm)
    names = FLAT_NAMES + (["hierarchical"] if net.two_level else [])
    return {(p, n): {name: predict(name, n, p, net) for name in names}
            for p in ranks for n in sizes}


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def format_table(table: dict[tuple[int, int], dict[str, float]]) -> str:
    """A Markdown table: p, size, winner and its time, each algorithm's time over the winner's."""
    names = list(next(iter(table.values())))
    head = ["p", "size", "winner", "time (us)"] + [f"{n} / best" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (p, n), times in table.items():
        win = min(times, key=times.__getitem__)
        cells = [str(p), _size(n), win, f"{times[win] * 1e6:.1f}"] + \
                [f"{times[name] / times[win]:.2f}" for name in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    from ..osu.options import parse_sizes

    p = argparse.ArgumentParser(prog="collectives-project", description=__doc__.split("\n\n")[0])
    p.add_argument("--alpha", type=float, default=5e-6, help="network latency per message, s")
    p.add_argument("--beta", type=float, default=8e-10, help="network time per byte, s/B")
    p.add_argument("--gamma", type=float, default=1e-10, help="reduction time per byte, s/B")
    p.add_argument("--ranks", type=lambda s: [int(v) for v in s.split(",")],
                   default=DEFAULT_RANKS, help="world sizes (default 16,64,256,1024,4096)")
    p.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES,
                   help="bytes per rank (default 8,1K,64K,1M,16M,256M)")
    p.add_argument("--segment-bytes", type=int, default=1 << 20,
                   help="segment size of ring and tree (default 1 MiB)")
    p.add_argument("--node-size", type=int, help="ranks per node: two levels, adds hierarchical")
    p.add_argument("--alpha-intra", type=float, default=1e-6, help="inside a node, s")
    p.add_argument("--beta-intra", type=float, default=1e-10, help="inside a node, s/B")
    p.add_argument("--inter-algorithm", default="ring", choices=FLAT_NAMES,
                   help="hierarchical's algorithm across nodes (default ring)")
    p.add_argument("--model", metavar="TUNING.json",
                   help="take every parameter from this tuning file's fitted model instead")
    p.add_argument("--world-size", type=int,
                   help="with --model: whose model (default: the first with two levels)")
    return p


def _describe(net: Network) -> str:
    if not net.two_level:
        return f"# alpha {net.alpha:g} s, beta {net.beta:g} s/B, gamma {net.gamma:g} s/B"
    return (f"# across nodes alpha {net.alpha_inter:g} s, beta {net.beta_inter:g} s/B (one flow; "
            f"a node's ranks share its link); nodes of {net.node_size} (alpha {net.alpha:g} s, "
            f"beta {net.beta:g} s/B inside); gamma {net.gamma:g} s/B")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> None:
    """Entry point of ``collectives-project``."""
    ap = _parser()
    args = ap.parse_args(argv)
    out = sys.stdout if out is None else out
    if args.model:
        try:
            net = from_tuning_file(args.model, args.world_size)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            ap.error(f"--model {args.model}: {exc}")
        net = replace(net, inter_algorithm=args.inter_algorithm,
                      node_size=args.node_size or net.node_size)
    else:
        net = Network(alpha=args.alpha, beta=args.beta, gamma=args.gamma,
                      segment_bytes=args.segment_bytes)
        if args.node_size:
            net = Network(alpha=args.alpha_intra, beta=args.beta_intra, gamma=args.gamma,
                          alpha_inter=args.alpha, beta_inter=args.beta,
                          segment_bytes=args.segment_bytes, node_size=args.node_size,
                          inter_algorithm=args.inter_algorithm)
    print(_describe(net), file=out)
    print(format_table(project(args.ranks, args.sizes, net)), file=out)


#: Console script ``collectives-project`` (``_runtime.cli.program``: an error is one line, exit 1).
script = program("collectives-project", main)

if __name__ == "__main__":
    sys.exit(script())
