"""A picture of a timeline, for readers without a trace viewer (``collectives-plot --timeline``).

One band per rank, top to bottom; inside it one row per lane (the caller's thread, then the
engine's threads), and in a row each span as a bar coloured by its category (:data:`COLOURS`).
Nested spans are drawn on top of their parents, each level a little thinner, so that a call's
exchange rounds show inside the call and an engine's run of a request inside the request. The
x axis is milliseconds on rank 0's clock. matplotlib is imported here only.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["COLOURS", "plot_timeline"]

#: The colour of each span category (hooks.py lists them; "user": the program's own phases;
#: "codec": the SGD driver's timing of its codec's methods).
COLOURS = {
    "user": "#c7c7c7", "call": "#1f77b4", "submit": "#9ecae1", "request": "#ff7f0e",
    "wait": "#d62728", "message": "#2ca02c", "shm": "#17becf", "encode": "#9467bd",
    "decode": "#e377c2", "aggregate": "#8c564b", "reduce": "#bcbd22", "codec": "#c5b0d5",
}
_ORDER = list(COLOURS)


def _rows(doc: dict[str, Any], window: tuple[float, float] | None
          ) -> tuple[list[tuple[int, int, str]], dict[tuple[int, int], list[tuple]]]:
    """The lanes in order ((pid, tid, name)) and each lane's spans as (start, length, category,
    depth), times in ms; spans outside ``window`` (ms) left out."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    spans: dict[tuple[int, int], list[tuple]] = {}
    stacks: dict[tuple[int, int], list[float]] = {}
    for e in doc["traceEvents"]:  # each lane's events come sorted, outer spans first
        if e["ph"] != "X":
            continue
        lane = (e["pid"], e["tid"])
        start, end = e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3
        stack = stacks.setdefault(lane, [])
        while stack and stack[-1] <= start:
            stack.pop()
        depth = len(stack)
        stack.append(end)
        if window is not None and (end < window[0] or start > window[1]):
            continue
        spans.setdefault(lane, []).append((start, end - start, e.get("cat", ""), depth))
    lanes = [(pid, tid, names.get((pid, tid), f"lane {tid}")) for pid, tid in sorted(spans)]
    return lanes, spans


def plot_timeline(doc: dict[str, Any], out: str | os.PathLike,
                  window: tuple[float, float] | None = None, title: str | None = None) -> str:
    """Draw ``doc`` (a merged timeline) into the PNG ``out``; ``window``: (start, end) in ms.
    Returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes, spans = _rows(doc, window)
    if not lanes:
        raise ValueError("the timeline has no spans" + (" in that window" if window else ""))
    height = 0.8
    fig, ax = plt.subplots(figsize=(12, 0.9 + 0.42 * len(lanes)))
    ticks, labels, used = [], [], set()
    for row, (pid, tid, name) in enumerate(lanes):
        y = len(lanes) - 1 - row
        groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for start, length, category, depth in spans[(pid, tid)]:
            groups.setdefault((category, depth), []).append((start, length))
        for (category, depth), bars in sorted(groups.items(), key=lambda g: g[0][1]):
            h = height * 0.78 ** min(depth, 6)
            ax.broken_barh(bars, (y - h / 2, h), facecolors=COLOURS.get(category, "#7f7f7f"),
                           edgecolor="none")
            used.add(category)
        ticks.append(y)
        short = name.replace("collectives-", "").split(" MPI_")[0].split(" (")[0]
        labels.append(f"rank {pid}: {short}")
    for row in range(1, len(lanes)):  # a line between ranks
        if lanes[row][0] != lanes[row - 1][0]:
            ax.axhline(len(lanes) - row - 0.5, color="black", linewidth=0.6)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    if window is not None:
        ax.set_xlim(*window)
    ax.set_xlabel("ms (rank 0's clock)")
    ax.legend(handles=[Patch(color=COLOURS.get(c, "#7f7f7f"), label=c)
                       for c in sorted(used, key=lambda c: _ORDER.index(c) if c in _ORDER
                                       else len(_ORDER))],
              loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.4 / len(lanes)),
              ncol=min(11, len(used)), fontsize=8, frameon=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return os.fspath(out)
