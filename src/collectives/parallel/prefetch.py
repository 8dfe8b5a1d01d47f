"""Stage 3's layer gathers as a schedule, each started one ahead on the progress engine.

A step of a model of ``L`` layers uses its parameters in this order: forward of layers
``0 .. L-1``, then backward of layers ``L-1 .. 1`` (the first layer's backward needs only its
input, not its weights). :func:`schedule` lists that order as data, ``(layer, "forward" |
"backward")``; the last layer's backward entry is dropped, as its forward gather is kept for it
(FSDP keeps the root's parameters the same way), so a step gathers ``2 L - 2`` layers.

:class:`LayerGather` walks the schedule: asked for an entry, it waits for that entry's gather
(started when the entry before it was asked for, so it travelled while that layer computed),
starts the next entry's gather (``collectives.iallgather`` through :class:`.zero.Zero`), and
hands out the gathered array, keeping no reference to it: the layer's parameters are freed as
soon as the model drops them. At most two gathered layers are alive at once (the one computing
and the one arriving), plus the last layer between its forward and its backward.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .zero import Zero

__all__ = ["schedule", "LayerGather", "FORWARD", "BACKWARD"]

FORWARD, BACKWARD = "forward", "backward"


def schedule(layers: int) -> list[tuple[int, str]]:
    """The order a step uses the parameters of ``layers`` layers in (module docstring)."""
    return [(i, FORWARD) for i in range(layers)] + \
        [(i, BACKWARD) for i in range(layers - 2, 0, -1)]


class LayerGather:
    """The layers' parameters for one step, gathered one ahead (module docstring).

    Parameters
    ----------
    zero
        The rank's shards (stage 3).
    bounds
        Flat offsets of the layers (``len(layers) + 1`` of them).
    order
        The entries in the order they are asked for (default :func:`schedule`).
    """

    def __init__(self, zero: Zero, bounds: Sequence[int],
                 order: Sequence[tuple[int, str]] | None = None) -> None:
        self.zero, self.bounds = zero, list(bounds)
        self.order = list(schedule(len(self.bounds) - 1) if order is None else order)
        self._next = 0          # index in order of the entry asked for next
        self._pending = None    # (entry, request, array) started ahead
        self._kept = None       # the last layer's forward parameters, for its backward

    def _start(self, k: int) -> None:
        if k < len(self.order):
            i = self.order[k][0]
            req, out = self.zero.start_gather(self.bounds[i], self.bounds[i + 1])
            self._pending = (self.order[k], req, out)

    def get(self, layer: int, phase: str) -> np.ndarray:
        """The flat parameters of ``layer`` for ``phase``; entries must be asked for in order."""
        last = len(self.bounds) - 2
        if phase == BACKWARD and layer == last and self._kept is not None:
            out, self._kept = self._kept, None
            return out
        k = self._next
        if k >= len(self.order) or self.order[k] != (layer, phase):
            raise RuntimeError(f"layer {layer} {phase} asked for out of order: expected "
                               f"{self.order[k] if k < len(self.order) else 'nothing'}")
        if self._pending is None:
            self._start(k)
        entry, req, out = self._pending
        self._pending = None
        if req is not None:  # None: settled already
            self.zero.wait(req)
        self._next = k + 1
        self._start(k + 1)  # travels while this layer computes
        if phase == "forward" and layer == last:
            self._kept = out
        return out

    def settle(self) -> None:
        """Wait for the gather in flight, if any, keeping its array for :meth:`get`: before the
        owned shard is written (the per-bucket update), since a gather on the progress engine
        reads it while it travels."""
        if self._pending is not None and self._pending[1] is not None:
            entry, req, out = self._pending
            self.zero.wait(req)
            self._pending = (entry, None, out)

    def finish(self) -> None:
        """Wait for a gather still in flight (a step that stopped early) and forget it."""
        if self._pending is not None and self._pending[1] is not None:
            self.zero.wait(self._pending[1])
        self._pending = None
        self._kept = None
