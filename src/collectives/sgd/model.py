"""A multi-layer perceptron in NumPy: ReLU hidden layers, softmax cross-entropy loss.

Parameters and gradients live in two :class:`~collectives.sgd.fusion.FusionBuffer` objects (weight
then bias of every layer), so the gradient of the whole model is one flat float32 array, ready
for one allreduce. Weights use He initialisation (He et al. 2015: normal with variance 2/fan_in),
biases start at zero, all drawn from ``default_rng(seed)`` so every rank builds the same model.

Forward: ``h_0 = x``, ``z_i = h_{i-1} W_i + b_i``, ``h_i = relu(z_i)``; the last ``z`` are the
logits. The loss is the batch mean of ``-log softmax(z)[y]``. Backward starts from
``dz = (softmax(z) - onehot(y)) / B`` and runs the chain rule down the layers.

Backward can report gradients as they become final (``on_ready``), so that their allreduce
starts while the rest of backward runs (wait-free backpropagation, as PyTorch DDP's and
Horovod's hooks do): layer by layer from the last, each layer's weight gradient in blocks of
rows (``row_blocks``; a block of rows of ``W_i`` is contiguous in the fusion buffer), the bias
before the weight's last block, which the bias follows in the buffer.

Sharded training (``--shard``) keeps slices of the buffers instead: the model is then made
with ``hold=`` naming the buffers it keeps (a buffer not kept is its layout only), and a
:class:`LayerSource` hands out each layer's parameters (gathered from their owners) and takes
its gradient block by block (reduced to its owners and freed).
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from .fusion import FusionBuffer

__all__ = ["MODELS", "MLP", "LayerSource", "layer_shapes", "initial_layers"]

#: model name -> hidden layer widths
MODELS: dict[str, tuple[int, ...]] = {
    "mlp": (256, 128),           # the default: a second or so per epoch on digits
    "wide": (4096, 4096),        # ~17 M parameters: the allreduce dominates each step
    "deep": (1024,) * 16,        # ~16 M parameters in 17 layers: for --pipeline
}


class MLP:
    """Fully connected ReLU network with a softmax output.

    Parameters
    ----------
    sizes
        Layer widths from input to output, e.g. ``(64, 256, 128, 10)``.
    seed
        Seed of the He initialisation (:func:`initial_layers`).
    hold
        The fusion buffers the model keeps ("params", "grads"); one not kept is its layout only,
        and a :class:`LayerSource` must stand in for it (a model not holding its parameters is
        not initialised: its keeper takes :func:`initial_layers`).
    """

    def __init__(self, sizes: Sequence[int], seed: int = 0, *,
                 hold: Sequence[str] = ("params", "grads")) -> None:
        if len(sizes) < 2 or min(sizes) < 1:
            raise ValueError(f"sizes must list at least input and output widths >= 1, got {sizes}")
        self.sizes = tuple(int(s) for s in sizes)
        self.seed = seed
        shapes = layer_shapes(self.sizes)
        self.params = FusionBuffer(shapes, allocate="params" in hold)
        self.grads = FusionBuffer(shapes, allocate="grads" in hold)
        if "params" in hold:
            for w, (w0, _) in zip(self.params.views[::2], initial_layers(self.sizes, seed)):
                w[...] = w0

    @property
    def layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        v = self.params.views
        return list(zip(v[::2], v[1::2]))

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Output scores for a batch ``x`` (no gradient bookkeeping)."""
        h = x
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.sizes) - 2:
                np.maximum(h, 0, out=h)
        return h

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray,
                      on_ready: Callable[[int, int], None] | None = None,
                      row_blocks: Callable[[int], Sequence[slice]] | None = None,
                      layers: "LayerSource | None" = None) -> tuple[float, int]:
        """Mean cross-entropy on ``(x, y)`` and the number of correct predictions; writes the
        gradient of the loss into ``self.grads``.

        ``on_ready(i, k)``, if given, is called as soon as block ``k`` of layer ``i``'s gradient
        is final: the rows ``row_blocks(i)[k]`` of the weight gradient (plus the whole bias for
        the last block). Without ``row_blocks`` every layer is one block.

        ``layers`` (a :class:`LayerSource`) replaces all three: it hands out each layer's
        parameters and the arrays its gradient is written to, and is called back as each block
        is final (sharded training: ``collectives.sgd.sync.sharded``).
        """
        src = _Own(self, on_ready, row_blocks) if layers is None else layers
        acts = [x]
        for i in range(len(self.sizes) - 1):
            w, b = src.params(i, False)
            z = acts[-1] @ w + b
            del w, b  # before the next layer's: a source may free them (sharded parameters)
            if i < len(self.sizes) - 2:
                np.maximum(z, 0, out=z)
            acts.append(z)
        n = x.shape[0]
        logp, dz = loss_gradient(acts[-1], y, n)
        loss = -float(logp[np.arange(n), y].mean())
        correct = int((logp.argmax(axis=1) == y).sum())
        for i in range(len(self.sizes) - 2, -1, -1):
            dz.sum(axis=0, out=src.grad_bias(i))
            for k, rows in enumerate(src.row_blocks(i)):
                np.matmul(acts[i][:, rows].T, dz, out=src.grad_rows(i, k, rows))
                src.on_ready(i, k)
            if i:
                w = src.params(i, True)[0]
                dz = dz @ w.T
                del w
                dz *= acts[i] > 0
        return loss, correct

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch: int = 1024,
                 layers: "LayerSource | None" = None) -> tuple[float, int]:
        """Summed loss and number of correct predictions on ``(x, y)``.

        With ``layers`` (sharded parameters) each layer's parameters are asked for once, for the
        whole of ``x``, and applied batch by batch: the products of :meth:`logits`, layer by
        layer instead of batch by batch, so the same bits."""
        if layers is None:
            zs = [self.logits(x[a:a + batch]) for a in range(0, len(y), batch)]
        else:
            zs = [x[a:a + batch] for a in range(0, len(y), batch)]
            for i in range(len(self.sizes) - 1):
                w, b = layers.params(i, False)
                zs = [h @ w + b for h in zs]
                if i < len(self.sizes) - 2:
                    for h in zs:
                        np.maximum(h, 0, out=h)
                del w, b
        loss, correct = 0.0, 0
        for a, z in zip(range(0, len(y), batch), zs):
            logp = _log_softmax(z)
            loss -= float(logp[np.arange(len(z)), y[a:a + batch]].sum())
            correct += int((z.argmax(axis=1) == y[a:a + batch]).sum())
        return loss, correct


class LayerSource(Protocol):
    """Where :meth:`MLP.loss_and_grad` takes each layer's parameters from and writes its
    gradient to: ``params(i, backward)`` gives ``(W_i, b_i)`` (forward, and ``W_i`` again in
    backward for ``i > 0``); ``grad_bias(i)`` the array ``b_i``'s gradient goes to;
    ``row_blocks(i)`` the blocks of rows of ``W_i``'s gradient, computed in order after the
    bias; ``grad_rows(i, k, rows)`` the array block ``k`` goes to; ``on_ready(i, k)`` is
    called once it is written (the last block's call also finishes the bias)."""

    def params(self, i: int, backward: bool) -> tuple[np.ndarray, np.ndarray]: ...

    def grad_bias(self, i: int) -> np.ndarray: ...

    def row_blocks(self, i: int) -> Sequence[slice]: ...

    def grad_rows(self, i: int, k: int, rows: slice) -> np.ndarray: ...

    def on_ready(self, i: int, k: int) -> None: ...


class _Own:
    """The model's own buffers as a :class:`LayerSource` (with the optional ``on_ready`` and
    ``row_blocks`` of :meth:`MLP.loss_and_grad`)."""

    __slots__ = ("p", "gw", "gb", "ready", "blocks")

    def __init__(self, model: MLP, on_ready: Callable[[int, int], None] | None,
                 row_blocks: Callable[[int], Sequence[slice]] | None) -> None:
        v = model.params.views
        self.p = list(zip(v[::2], v[1::2]))
        self.gw, self.gb = model.grads.views[::2], model.grads.views[1::2]
        self.ready, self.blocks = on_ready, row_blocks

    def params(self, i: int, backward: bool) -> tuple[np.ndarray, np.ndarray]:
        return self.p[i]

    def grad_bias(self, i: int) -> np.ndarray:
        return self.gb[i]

    def row_blocks(self, i: int) -> Sequence[slice]:
        return [slice(None)] if self.blocks is None else self.blocks(i)

    def grad_rows(self, i: int, k: int, rows: slice) -> np.ndarray:
        return self.gw[i][rows]

    def on_ready(self, i: int, k: int) -> None:
        if self.ready is not None:
            self.ready(i, k)


def layer_shapes(sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """The tensors of an MLP of layer widths ``sizes``: weight then bias of every layer."""
    shapes: list[tuple[int, ...]] = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        shapes += [(fan_in, fan_out), (fan_out,)]
    return shapes


def initial_layers(sizes: Sequence[int], seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The He-initialised ``(W_i, b_i)`` of every layer, in order, one at a time (a sharded
    trainer keeps its slices without ever holding the whole model)."""
    rng = np.random.default_rng(seed)
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        w = rng.standard_normal((fan_in, fan_out), dtype=np.float32) \
            * np.float32(np.sqrt(2.0 / fan_in))
        yield w, np.zeros(fan_out, dtype=np.float32)


def loss_gradient(z: np.ndarray, y: np.ndarray, scale: int) -> tuple[np.ndarray, np.ndarray]:
    """The log-softmax of the logits ``z`` and the loss's gradient with respect to them,
    ``(softmax(z) - onehot(y)) / scale`` (``scale``: the batch the loss is the mean over)."""
    logp = _log_softmax(z)
    dz = np.exp(logp)
    dz[np.arange(len(y)), y] -= 1
    dz /= np.float32(scale)
    return logp, dz


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))
