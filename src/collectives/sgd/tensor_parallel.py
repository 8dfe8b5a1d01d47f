"""The MLP with its hidden layers split Megatron-style over a ``tp`` axis: the plan, and a whole
model on one axis.

Each consecutive pair of hidden layers (the layers whose outputs are hidden activations: the
first and second, the third and fourth, ...) is split over the ``tp`` axis, the first by
columns, the second by rows (:mod:`collectives.parallel.tensor`); a hidden layer left without a
partner and the output layer run replicated on every rank of the axis (:func:`plan`;
:func:`check` says when the widths do not allow it). The driver's ``--tensor T`` (and the ``tp``
axis of ``--mesh``) runs this plan stage by stage (:class:`collectives.sgd.pipelined.MLPStage`).

:class:`TensorParallelMLP` has :class:`collectives.sgd.model.MLP`'s surface (``params`` and
``grads`` fusion buffers, ``loss_and_grad``, ``evaluate``): the buffers hold this rank's shards
of the split layers and the whole replicated ones, layer by layer (weight, bias), so with
``T = 1`` the layout and every bit of the arithmetic are the MLP's. It is built from the MLP
seeded the same way, each split layer keeping its slice: the shards of the ``tp`` ranks
concatenate to the one-process model (:meth:`TensorParallelMLP.full_params` gathers them).
Forward and backward are collective over the ``tp`` axis (two allreduces of ``B x width``
activations per split pair and step, the first pair's backward one fewer: no input gradient).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from mpi4py import MPI

from ..api import allgather
from ..parallel.tensor import ColumnParallelLinear, RowParallelLinear
from .fusion import FusionBuffer
from .model import MLP, _log_softmax, loss_gradient

__all__ = ["TensorParallelMLP", "plan", "check"]

#: how a layer runs: split by columns, split by rows, or whole on every rank of the axis
KINDS = ("column", "row", "replicated")


def plan(sizes: Sequence[int]) -> list[str]:
    """The kind of each linear layer of the MLP ``sizes`` (input, hidden..., output): the hidden
    layers in consecutive pairs (column, row), an unpaired one and the output layer replicated."""
    hidden = len(sizes) - 2
    kinds = ["replicated"] * (len(sizes) - 1)
    for i in range(0, hidden - 1, 2):
        kinds[i], kinds[i + 1] = "column", "row"
    return kinds


def check(hidden: Sequence[int], tensor: int, flag: str = "--tensor") -> str | None:
    """Why an MLP of the ``hidden`` widths cannot have its pairs split over ``tensor`` ranks
    (``flag``: how the message names the axis size), or None."""
    for i, kind in enumerate(plan((1, *hidden, 1))):
        if kind == "column" and hidden[i] % tensor:
            return (f"{flag}{'' if flag.endswith('=') else ' '}{tensor} does not divide the "
                    f"hidden width {hidden[i]} of layer {i + 1} (split by columns, layer "
                    f"{i + 2} by rows); choose widths that are multiples of {tensor}")
    return None


class TensorParallelMLP:
    """The MLP ``sizes`` seeded with ``seed``, its hidden pairs split over ``comm`` (the ``tp``
    axis; module docstring), allreduces by ``algorithm``."""

    def __init__(self, sizes: Sequence[int], comm: MPI.Comm, seed: int = 0,
                 algorithm: str = "ring") -> None:
        full = MLP(sizes, seed)  # the one-process model: each split layer keeps its slice
        self.sizes, self.comm = full.sizes, comm
        self.kinds = plan(self.sizes)
        self.split: list[ColumnParallelLinear | RowParallelLinear | None] = []
        for (w, b), kind, n_in, n_out in zip(full.layers, self.kinds, self.sizes, self.sizes[1:]):
            cls = {"column": ColumnParallelLinear, "row": RowParallelLinear}.get(kind)
            self.split.append(None if cls is None else
                              cls(n_in, n_out, comm, weight=w, bias=b, algorithm=algorithm))
        shapes: list[tuple[int, ...]] = []
        for layer, (w, b) in zip(self.split, full.layers):
            shapes += [w.shape, b.shape] if layer is None else \
                [layer.weight.shape, layer.bias.shape]
        self.params, self.grads = FusionBuffer(shapes), FusionBuffer(shapes)
        for i, (layer, (w, b)) in enumerate(zip(self.split, full.layers)):
            views = (self.params.views[2 * i], self.params.views[2 * i + 1],
                     self.grads.views[2 * i], self.grads.views[2 * i + 1])
            if layer is None:
                views[0][...], views[1][...] = w, b
            else:
                layer.bind(*views)

    @property
    def comm_stats(self) -> tuple[float, int]:
        """The split layers' allreduces over the axis so far: (seconds, bytes reduced)."""
        layers = [layer for layer in self.split if layer is not None]
        return (sum(layer.comm_seconds for layer in layers),
                sum(layer.comm_elements for layer in layers) * 4)

    @property
    def layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        v = self.params.views
        return list(zip(v[::2], v[1::2]))

    def _forward(self, x: np.ndarray) -> list[np.ndarray]:
        """Every layer's output (a split column layer's: this rank's block), ReLU applied to the
        hidden ones; collective over the axis."""
        acts = [x]
        for i, ((w, b), layer) in enumerate(zip(self.layers, self.split)):
            z = acts[-1] @ w + b if layer is None else layer.forward(acts[-1])
            if i < len(self.sizes) - 2:
                np.maximum(z, 0, out=z)
            acts.append(z)
        return acts

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Output scores for a batch ``x``, the same bits on every rank of the axis."""
        return self._forward(x)[-1]

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray,
                      on_ready: Callable[[int, int], None] | None = None,
                      row_blocks: Callable[[int], Sequence[slice]] | None = None
                      ) -> tuple[float, int]:
        """:meth:`MLP.loss_and_grad` (without the backward hooks: the driver refuses
        ``--overlap`` with ``--tensor``); collective over the axis."""
        if on_ready is not None:
            raise ValueError("TensorParallelMLP: backward hooks (--overlap) are not supported")
        acts = self._forward(x)
        n = x.shape[0]
        logp, dz = loss_gradient(acts[-1], y, n)
        loss = -float(logp[np.arange(n), y].mean())
        correct = int((logp.argmax(axis=1) == y).sum())
        gw, gb = self.grads.views[::2], self.grads.views[1::2]
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.split[i]
            if layer is None:
                dz.sum(axis=0, out=gb[i])
                np.matmul(acts[i].T, dz, out=gw[i])
                dx = dz @ self.layers[i][0].T if i else None
            else:  # the gradients land in the buffers' views (bind)
                dx = layer.backward(dz, input_grad=i > 0)
            if i:
                dz = dx
                dz *= acts[i] > 0
        return loss, correct

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch: int = 1024) -> tuple[float, int]:
        """Summed loss and number of correct predictions on ``(x, y)``; collective."""
        loss, correct = 0.0, 0
        for a in range(0, len(y), batch):
            z = self.logits(x[a:a + batch])
            logp = _log_softmax(z)
            loss -= float(logp[np.arange(len(z)), y[a:a + batch]].sum())
            correct += int((z.argmax(axis=1) == y[a:a + batch]).sum())
        return loss, correct

    def full_params(self) -> np.ndarray:
        """Collective over the axis: the unsplit model's flat parameters (the layout of
        :class:`MLP`'s ``params``), gathered from the shards."""
        parts = []
        for (w, b), layer, n_in, n_out in zip(self.layers, self.split, self.sizes,
                                              self.sizes[1:]):
            if layer is None:
                parts += [w.ravel(), b.ravel()]
                continue
            gathered = allgather(np.ascontiguousarray(w), comm=self.comm)
            if isinstance(layer, ColumnParallelLinear):  # blocks of columns, rank after rank
                t = self.comm.size
                parts.append(gathered.reshape(t, n_in, n_out // t).transpose(1, 0, 2).ravel())
                parts.append(allgather(np.ascontiguousarray(b), comm=self.comm))
            else:  # blocks of rows: the flat concatenation; the bias is whole
                parts += [gathered, b.ravel()]
        return np.concatenate(parts).astype(np.float32, copy=False)
