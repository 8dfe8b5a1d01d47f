"""Message patterns of the allreduce algorithms, recorded from real calls and drawn.

``mpiexec -n 4 python -m collectives.tools.osu.schedule -o docs/figures`` runs one allreduce of each
algorithm (``--algorithms``; default every hand-written one) under the recorder of
``_runtime/trace.py``, gathers every rank's operations to rank 0 and draws a space-time diagram
per algorithm, ``schedule_<algorithm>_p<P>.png``: ranks are rows, steps are columns, each message
is an arrow from its sender to its receiver labelled with its size as a fraction of the vector
``n``, a pass through a node's shared window is a box over the node's ranks, and the right margin
gives the bytes each rank sent. docs/algorithms.md shows them.

Steps are not timestamps: they come from the order of operations alone. Each rank's operations
follow one another, a message is received no earlier than its step of sending, and the ranks of a
shared-memory pass take it together. Within those constraints the diagram takes the number of steps
the shortest schedule has, and each rank's first operation as late as that schedule allows, every
later one as early as it can (so a rank that waits for nothing lines up with the step in which
its partner is ready: all pairs of a folded recursive doubling exchange in the same column). A
send-receive pair of one rank is one operation.

matplotlib is imported only to draw (the optional extra ``plot``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Sequence

import numpy as np
from mpi4py import MPI

from ... import api
from ..._runtime.cli import PLOT_INSTALL, Parser, UsageError, program, usage_errors
from ..._runtime.trace import Event, recording
from ...options import Options

__all__ = ["Message", "Window", "Schedule", "DRAWN", "place", "schedule", "record", "draw",
           "main"]

#: The algorithms drawn by default: every one that sends messages of its own ("shm" shares a
#: window and sends none; "native" is MPI's; "auto" picks one of these).
DRAWN = ("ring", "tree", "recursive_doubling", "rabenseifner", "hierarchical")

#: Default vector length (float32): divisible by 1..8, so every block split is even.
COUNT = 840


@dataclass(frozen=True)
class Message:
    """One message: sent by ``src`` to ``dst`` in ``step``, ``nbytes`` long."""

    step: int
    src: int
    dst: int
    nbytes: int


@dataclass(frozen=True)
class Window:
    """One pass through a node's shared window (``mode``) by ``ranks``, in ``step``."""

    step: int
    mode: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Schedule:
    """What one allreduce call did on every rank: its messages and shared-memory passes."""

    algorithm: str
    ranks: int
    nbytes: int                  # the vector, per rank
    messages: tuple[Message, ...]
    windows: tuple[Window, ...]

    @property
    def steps(self) -> int:
        last = [m.step for m in self.messages] + [w.step for w in self.windows]
        return max(last) + 1 if last else 0

    def sent(self, rank: int) -> int:
        """Bytes ``rank`` sent."""
        return sum(m.nbytes for m in self.messages if m.src == rank)


def place(events: Sequence[Sequence[Event]]) -> list[list[int]]:
    """The step of every operation (``events[rank][i]``), as the module docstring says.

    Raises
    ------
    ValueError
        A send without its receive (or the other way round), or operations that wait on each
        other in a cycle: not the record of a call that completed.
    """
    nodes = [(r, i) for r, evs in enumerate(events) for i in range(len(evs))]
    edges: list[tuple[tuple[int, int], tuple[int, int], int]] = []  # step[b] >= step[a] + w
    sends: dict[tuple[int, int], list[tuple[int, int]]] = {}
    recvs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    passes: dict[tuple, list[tuple[int, int]]] = {}
    for r, evs in enumerate(events):
        seen: dict[tuple, int] = {}
        for i, e in enumerate(evs):
            if i:
                edges.append(((r, i - 1), (r, i), 1))
            if e.dest >= 0:
                sends.setdefault((r, e.dest), []).append((r, i))
            if e.source >= 0:
                recvs.setdefault((e.source, r), []).append((r, i))
            if e.group:
                key = (e.kind, e.group)
                k = seen[key] = seen.get(key, -1) + 1
                passes.setdefault(key + (k,), []).append((r, i))
    for pair in set(sends) | set(recvs):  # MPI's order: the k-th send matches the k-th receive
        s, t = sends.get(pair, []), recvs.get(pair, [])
        if len(s) != len(t):
            raise ValueError(f"{len(s)} sends from rank {pair[0]} to {pair[1]}, {len(t)} receives")
        edges += [(a, b, 0) for a, b in zip(s, t)]
    for members in passes.values():  # the ranks of a pass take it together
        edges += [(a, b, 0) for a in members for b in members if a != b]
    early = dict.fromkeys(nodes, 0)
    if not _relax(early, edges, lambda a, b, w, s: (b, s[a] + w) if s[b] < s[a] + w else None):
        raise ValueError("operations wait on each other in a cycle")
    last = max(early.values(), default=0)
    late = dict.fromkeys(nodes, last)
    _relax(late, edges, lambda a, b, w, s: (a, s[b] - w) if s[a] > s[b] - w else None)
    # each rank starts as late as the shortest schedule allows, then goes as early as it can
    step = {n: late[n] if n[1] == 0 else 0 for n in nodes}
    _relax(step, edges, lambda a, b, w, s: (b, s[a] + w) if s[b] < s[a] + w else None)
    return [[step[(r, i)] for i in range(len(evs))] for r, evs in enumerate(events)]


def _relax(step: dict, edges: list, tighten) -> bool:
    """Apply ``tighten`` to every edge until nothing changes (False: it never settles)."""
    for _ in range(len(step) + 2):
        changed = False
        for a, b, w in edges:
            update = tighten(a, b, w, step)
            if update is not None:
                step[update[0]] = update[1]
                changed = True
        if not changed:
            return True
    return False


def schedule(algorithm: str, nbytes: int, events: Sequence[Sequence[Event]]) -> Schedule:
    """The :class:`Schedule` of one call from every rank's events (``events[rank]``)."""
    steps = place(events)
    messages, windows = [], {}
    for r, evs in enumerate(events):
        for e, t in zip(evs, steps[r]):
            if e.dest >= 0:
                messages.append(Message(t, r, e.dest, e.sent))
            if e.group:
                windows[(t, e.kind, e.group)] = Window(t, e.kind, e.group)
    messages.sort(key=lambda m: (m.step, m.src))
    return Schedule(algorithm, len(events), nbytes, tuple(messages),
                    tuple(sorted(windows.values(), key=lambda w: (w.step, w.ranks))))


def record(algorithm: str, comm: MPI.Comm, count: int = COUNT,
           options: Options | None = None) -> Schedule:
    """Run one allreduce of ``count`` float32 with ``algorithm`` on ``comm`` (collective), record
    it and return its :class:`Schedule` on every rank. A first, unrecorded call sets up what the
    algorithm caches on the communicator."""
    options = options or Options()
    x = np.arange(count, dtype=np.float32) + comm.rank
    y = np.empty_like(x)
    api.allreduce(x, out=y, algorithm=algorithm, comm=comm, options=options)
    comm.Barrier()
    with recording(comm) as events:
        api.allreduce(x, out=y, algorithm=algorithm, comm=comm, options=options)
    return schedule(algorithm, x.nbytes, comm.allgather(list(events)))


def _fraction(nbytes: int, whole: int) -> str:
    f = Fraction(nbytes, whole).limit_denominator(4096)
    if f == 1:
        return "n"
    if f.denominator == 1:
        return f"{f.numerator}n"
    return f"n/{f.denominator}" if f.numerator == 1 else f"{f.numerator}n/{f.denominator}"


def draw(s: Schedule, output: str | Path, title: str | None = None) -> Path:
    """The space-time diagram of ``s`` as a PNG (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    cols = max(s.steps, 1)
    fig, ax = plt.subplots(figsize=(1.3 + 1.25 * cols + 1.3, 0.9 + 0.55 * s.ranks))
    for t in range(cols + 1):
        ax.axvline(t, color="0.88", lw=0.8, zorder=0)
    for r in range(s.ranks):
        ax.axhline(r, color="0.8", lw=0.8, zorder=0)
    for w in s.windows:
        lo, hi = min(w.ranks), max(w.ranks)
        ax.add_patch(Rectangle((w.step + 0.08, lo - 0.3), 0.84, hi - lo + 0.6, color="C1",
                               alpha=0.25, lw=0))
        ax.text(w.step + 0.5, (lo + hi) / 2, w.mode.replace(" ", "\n", 1), ha="center",
                va="center", fontsize=7, color="0.25")
    for m in s.messages:
        start, end = (m.step + 0.1, m.src), (m.step + 0.9, m.dst)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, lw=1.1,
                                     color="C0", shrinkA=0, shrinkB=0))
        lx, ly = start[0] + 0.2 * (end[0] - start[0]), start[1] + 0.2 * (end[1] - start[1])
        ax.text(lx, ly, _fraction(m.nbytes, s.nbytes), fontsize=6.5, ha="center", va="center",
                bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.85))
    for r in range(s.ranks):
        ax.text(cols + 0.12, r, f"sent {_fraction(s.sent(r), s.nbytes) if s.sent(r) else '0'}",
                fontsize=7.5, va="center")
    ax.set_xlim(-0.05, cols + 1.1)
    ax.set_ylim(s.ranks - 0.5, -0.5)
    ax.set_yticks(range(s.ranks), [f"rank {r}" for r in range(s.ranks)])
    ax.set_xticks([t + 0.5 for t in range(cols)], [str(t) for t in range(cols)])
    ax.set_xlabel("step")
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"{s.algorithm}, p = {s.ranks}: {len(s.messages)} messages in "
                 f"{s.steps} steps (n = {s.nbytes} B per rank)", fontsize=9)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return Path(output)


def main(argv: Sequence[str] | None = None, comm: MPI.Comm | None = None) -> list[Path]:
    """Record and draw (see the module docstring); returns the files written (rank 0)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    with usage_errors("schedule", comm.rank):
        ap = Parser(prog="python -m collectives.tools.osu.schedule",
                    description=__doc__.split("\n\n")[0], rank=comm.rank)
        ap.add_argument("-o", "--output", default=".", help="folder for the PNGs (default: .)")
        ap.add_argument("--algorithms", default=",".join(DRAWN),
                        help=f"comma-separated (default: {','.join(DRAWN)})")
        ap.add_argument("--count", type=int, default=COUNT, help="float32 elements per rank")
        ap.add_argument("--node-size", type=int, default=2,
                        help="emulated node size for hierarchical (default 2)")
        args = ap.parse_args(argv)
        import importlib.util

        from ...algorithms import ALGORITHMS

        names = [a for a in args.algorithms.split(",") if a]
        unknown = [a for a in names if a not in ALGORITHMS]
        if unknown:
            raise UsageError(f"unknown algorithm {unknown[0]!r}; valid choices: "
                             f"{', '.join(ALGORITHMS)}")
        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError(f"drawing needs matplotlib: {PLOT_INSTALL}")
    opts = Options(node_size=args.node_size)
    written = []
    for name in names:
        s = record(name, comm, args.count, opts)
        if comm.rank == 0:
            out = draw(s, Path(args.output) / f"schedule_{name}_p{comm.size}.png")
            print(f"wrote {out}: {len(s.messages)} messages, {s.steps} steps", flush=True)
            written.append(out)
    return written


if __name__ == "__main__":
    sys.exit(program("schedule", main)())
