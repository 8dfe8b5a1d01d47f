"""``collectives-project`` / ``python -m collectives.tuning.projection``: which algorithm wins at scale.

Evaluates the cost model (:mod:`collectives.tuning.cost_model`) of every hand-written allreduce for 16 to
4096 ranks on a network you describe, and prints, for each world size and message size, the
winner and every algorithm's predicted time relative to it. Flat algorithms cross the network
(``--alpha``, ``--beta``); ``--gamma`` is the local reduction cost. With ``--node-size M``,
"hierarchical" is included: rings inside nodes of M ranks (``--alpha-intra``, ``--beta-intra``,
shared memory) and ``--inter-algorithm`` across nodes on the network. "native" is left out: its
model is MPICH's own choice between recursive doubling and Rabenseifner.

Defaults describe 10 Gbit/s Ethernet (alpha 5 us, beta 0.8 ns/B) and a 10 GB/s reduction.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence, TextIO

from .cost_model import Network, predict

__all__ = ["project", "format_table", "main"]

DEFAULT_RANKS = [16, 64, 256, 1024, 4096]
DEFAULT_SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
FLAT_NAMES = ["ring", "tree", "recursive_doubling", "rabenseifner"]


def project(ranks: Sequence[int], sizes: Sequence[int], net: Network,
            intra: Network | None = None) -> dict[tuple[int, int], dict[str, float]]:
    """Predicted seconds by (p, size) and algorithm; "hierarchical" when ``intra`` is given.

    ``net`` holds the network (flat algorithms); ``intra`` the inside-node parameters, with its
    ``node_size``; hierarchical uses ``intra`` inside nodes and ``net`` across them.
    """
    table = {}
    for p in ranks:
        for n in sizes:
            times = {name: predict(name, n, p, net) for name in FLAT_NAMES}
            if intra is not None:
                hier = Network(alpha=intra.alpha, beta=intra.beta, gamma=net.gamma,
                               alpha_inter=net.alpha, beta_inter=net.beta,
                               segment_bytes=net.segment_bytes, node_size=intra.node_size,
                               inter_algorithm=intra.inter_algorithm)
                times["hierarchical"] = predict("hierarchical", n, p, hier)
            table[(p, n)] = times
    return table


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
    from ..bench.options import parse_sizes

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
    p.add_argument("--node-size", type=int, help="ranks per node: adds hierarchical")
    p.add_argument("--alpha-intra", type=float, default=1e-6, help="inside a node, s")
    p.add_argument("--beta-intra", type=float, default=1e-10, help="inside a node, s/B")
    p.add_argument("--inter-algorithm", default="ring", choices=FLAT_NAMES,
                   help="hierarchical's algorithm across nodes (default ring)")
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> None:
    """Entry point of ``collectives-project``."""
    args = _parser().parse_args(argv)
    out = sys.stdout if out is None else out
    net = Network(alpha=args.alpha, beta=args.beta, gamma=args.gamma,
                  segment_bytes=args.segment_bytes)
    intra = None
    if args.node_size:
        intra = Network(alpha=args.alpha_intra, beta=args.beta_intra, gamma=args.gamma,
                        node_size=args.node_size, inter_algorithm=args.inter_algorithm)
    print(f"# alpha {args.alpha:g} s, beta {args.beta:g} s/B, gamma {args.gamma:g} s/B"
          + (f"; nodes of {args.node_size} (alpha {args.alpha_intra:g} s, beta "
             f"{args.beta_intra:g} s/B inside)" if intra else ""), file=out)
    print(format_table(project(args.ranks, args.sizes, net, intra)), file=out)


if __name__ == "__main__":
    main()
