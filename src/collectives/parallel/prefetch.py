"""Stage 3's layer gathers as a schedule, each started one ahead on the progress engine.

A step of a model of ``L`` layers uses its parameters in this order: forward of layers
``0 .. L-1``, then backward of layers ``L-1 .. 1`` (the first layer's backward needs only its
input, not its weights). :func:`schedule` lists that order as data, ``(layer, "forward" |
"backward")``. The last ``keep`` layers' backward entries are dropped: their forward gathers are
kept for their backward instead of being freed and gathered again. FSDP keeps the root's
parameters that way; DeepSpeed's ZeRO-3 keeps any parameter whose next use comes within
``stage3_max_reuse_distance`` parameters. Here :func:`keep_for` decides from the layers' sizes:
the most trailing layers whose keeping adds no memory, i.e. whose schedule holds no more gathered
parameters at any moment (:func:`live_peak`) than keeping the last layer alone (at least 1). A
model with one large layer among small ones (the driver's ``wide``: 98 % of it in the middle
layer) then gathers nothing in backward, and a step sends 2/3 of what it sent when every layer
was gathered twice: the bytes of an allreduce. The driver's ``deep`` model (equal hidden layers,
a small last one) keeps its last layer only: a second kept layer would hold three layers at the
last forward (two kept, one arriving) where the peak is two.

:class:`LayerGather` walks the schedule: asked for an entry, it waits for that entry's gather
(started when the entry before it was asked for, so it travelled while that layer computed),
starts the next entry's gather (``collectives.iallgather`` through :class:`.zero.Zero`), and
hands out the gathered array, keeping no reference to it unless the layer is kept: the layer's
parameters are freed as soon as the model drops them. At most two gathered layers are alive at
once (the one computing and the one arriving), plus the kept layers between their forward and
their backward. The values are the same either way (a layer's shard is updated only after its
backward), so a kept layer changes no bit of the training.

Cost: a step gathers ``2 L - 1 - keep`` layers, ``(p - 1) / p`` of each layer's bytes per rank
(ring allgather), against ``2 L - 2`` when only the last layer is kept.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .zero import Zero

__all__ = ["schedule", "live_peak", "keep_for", "LayerGather", "FORWARD", "BACKWARD"]

FORWARD, BACKWARD = "forward", "backward"


def schedule(layers: int, keep: int = 1) -> list[tuple[int, str]]:
    """The order a step uses the parameters of ``layers`` layers in, without the backward
    entries of the last ``keep`` layers (module docstring)."""
    if layers > 0 and not 1 <= keep <= max(1, layers - 1):
        raise ValueError(f"keep must be in 1..{max(1, layers - 1)} for {layers} layers, "
                         f"got {keep}")
    return [(i, FORWARD) for i in range(layers)] + \
        [(i, BACKWARD) for i in range(layers - 1 - keep, 0, -1)]


def live_peak(sizes: Sequence[int], keep: int = 1) -> int:
    """The most gathered parameters (elements) alive at once when :class:`LayerGather` walks
    :func:`schedule` ``(len(sizes), keep)``: at each entry the layer computing (a kept one
    counted once), the next entry arriving, and the kept layers whose forward has run. The kept
    layers' backward comes right after the last forward, and frees them before the first entry
    of backward: the most they hold with the gather arriving is the last forward's count."""
    layers = len(sizes)
    order = schedule(layers, keep)
    kept = range(layers - keep, layers)
    peak = 0
    for k, (layer, phase) in enumerate(order):
        arriving = sizes[order[k + 1][0]] if k + 1 < len(order) else 0
        if phase == FORWARD:
            held = sum(sizes[j] for j in kept if j <= layer)
            held += 0 if layer in kept else sizes[layer]
        else:
            held = sizes[layer]
        peak = max(peak, held + arriving)
    return peak


def keep_for(sizes: Sequence[int]) -> int:
    """How many trailing layers to keep from forward to backward: the most for which
    :func:`live_peak` is no higher than keeping the last layer alone (module docstring)."""
    layers = len(sizes)
    if layers < 3:
        return 1
    budget, keep = live_peak(sizes, 1), 1
    while keep + 1 <= layers - 1 and live_peak(sizes, keep + 1) <= budget:
        keep += 1
    return keep


class LayerGather:
    """The layers' parameters for one step, gathered one ahead (module docstring).

    Parameters
    ----------
    zero
        The rank's shards (stage 3).
    bounds
        Flat offsets of the layers (``len(layers) + 1`` of them).
    keep
        How many trailing layers keep their forward gather for their backward (default
        :func:`keep_for` of the layers' sizes).
    """

    def __init__(self, zero: Zero, bounds: Sequence[int], keep: int | None = None) -> None:
        self.zero, self.bounds = zero, list(bounds)
        layers = len(self.bounds) - 1
        if keep is None:
            keep = keep_for([hi - lo for lo, hi in zip(self.bounds, self.bounds[1:])])
        self.order = schedule(layers, keep)
        self._kept_layers = frozenset(range(layers - keep, layers))
        self._next = 0          # index in order of the entry asked for next
        self._pending = None    # (entry, request, array) started ahead
        self._kept: dict[int, np.ndarray] = {}  # kept layers' forward parameters

    def _start(self, k: int) -> None:
        if k < len(self.order):
            i = self.order[k][0]
            req, out = self.zero.start_gather(self.bounds[i], self.bounds[i + 1])
            self._pending = (self.order[k], req, out)

    def get(self, layer: int, phase: str) -> np.ndarray:
        """The flat parameters of ``layer`` for ``phase``; entries must be asked for in order."""
        if phase == BACKWARD and layer in self._kept:
            return self._kept.pop(layer)
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
        if phase == FORWARD and layer in self._kept_layers:
            self._kept[layer] = out
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
        self._kept = {}
