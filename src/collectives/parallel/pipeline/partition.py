"""Cut ``L`` layers into ``S`` consecutive stages: balanced by a cost per layer, or as given.

:func:`balanced` minimises the largest stage's cost (the pipeline's step is paced by its
slowest stage) over every way of cutting the layers into ``S`` consecutive non-empty runs: the
linear partition problem, solved exactly by dynamic programming in ``O(S L^2)`` (``L`` is tens
here). Ties go to the cut that puts more layers early. The cost is whatever the caller
measures or estimates per layer; the SGD driver passes each layer's parameter count, which is
proportional to its forward and backward FLOPs for a dense layer (``2 B fan_in fan_out``
forward, twice that backward).

:func:`given` checks a user's split (layers per stage, e.g. ``(3, 5, 8)``). Both return the
stage boundaries ``(0, b_1, ..., L)``: stage ``s`` holds layers ``bounds[s]:bounds[s+1]``.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["balanced", "given", "check_stages"]


def check_stages(layers: int, stages: int) -> None:
    """Raise ValueError unless ``1 <= stages <= layers``."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"pipeline stages must be a positive integer, got {stages!r}")
    if stages > layers:
        raise ValueError(f"cannot cut {layers} layers into {stages} pipeline stages: every "
                         f"stage needs at least one layer")


def balanced(costs: Sequence[float], stages: int) -> tuple[int, ...]:
    """Boundaries of the consecutive split of layers with ``costs`` into ``stages`` stages
    whose largest stage cost is smallest."""
    n = len(costs)
    check_stages(n, stages)
    if any(c < 0 for c in costs):
        raise ValueError(f"layer costs must be non-negative, got {list(costs)}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    # best[k][i]: the smallest largest-stage cost of layers 0:i in k stages; cut[k][i] its last cut
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(i - 1, k - 2, -1):  # the last stage holds layers j:i
                v = max(best[k - 1][j], prefix[i] - prefix[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    bounds = [n]
    for k in range(stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    return tuple(reversed(bounds))


def given(split: Sequence[int], layers: int) -> tuple[int, ...]:
    """Boundaries of a user's split: ``split[s]`` layers in stage ``s``, each at least one,
    adding up to ``layers``."""
    split = tuple(split)
    if not split or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in split):
        raise ValueError(f"a pipeline split lists at least one layer per stage, got {split}")
    if sum(split) != layers:
        raise ValueError(f"the pipeline split {','.join(map(str, split))} holds {sum(split)} "
                         f"layers, the model has {layers}")
    bounds = [0]
    for k in split:
        bounds.append(bounds[-1] + k)
    return tuple(bounds)
