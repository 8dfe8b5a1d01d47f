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
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .fusion import FusionBuffer

__all__ = ["MODELS", "MLP"]

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
        Seed of the He initialisation.
    """

    def __init__(self, sizes: Sequence[int], seed: int = 0) -> None:
        if len(sizes) < 2 or min(sizes) < 1:
            raise ValueError(f"sizes must list at least input and output widths >= 1, got {sizes}")
        self.sizes = tuple(int(s) for s in sizes)
        shapes = []
        for fan_in, fan_out in zip(self.sizes, self.sizes[1:]):
            shapes += [(fan_in, fan_out), (fan_out,)]
        self.params = FusionBuffer(shapes)
        self.grads = FusionBuffer(shapes)
        rng = np.random.default_rng(seed)
        for w, fan_in in zip(self.params.views[::2], self.sizes):
            w[...] = rng.standard_normal(w.shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))

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
                      row_blocks: Callable[[int], Sequence[slice]] | None = None
                      ) -> tuple[float, int]:
        """Mean cross-entropy on ``(x, y)`` and the number of correct predictions; writes the
        gradient of the loss into ``self.grads``.

        ``on_ready(i, k)``, if given, is called as soon as block ``k`` of layer ``i``'s gradient
        is final: the rows ``row_blocks(i)[k]`` of the weight gradient (plus the whole bias for
        the last block). Without ``row_blocks`` every layer is one block.
        """
        acts = [x]
        for i, (w, b) in enumerate(self.layers):
            z = acts[-1] @ w + b
            if i < len(self.sizes) - 2:
                np.maximum(z, 0, out=z)
            acts.append(z)
        logp = _log_softmax(acts[-1])
        n = x.shape[0]
        loss = -float(logp[np.arange(n), y].mean())
        correct = int((logp.argmax(axis=1) == y).sum())
        dz = np.exp(logp)
        dz[np.arange(n), y] -= 1
        dz /= np.float32(n)
        gw, gb = self.grads.views[::2], self.grads.views[1::2]
        for i in range(len(self.layers) - 1, -1, -1):
            dz.sum(axis=0, out=gb[i])
            blocks = row_blocks(i) if row_blocks is not None else [slice(None)]
            for k, rows in enumerate(blocks):
                np.matmul(acts[i][:, rows].T, dz, out=gw[i][rows])
                if on_ready is not None:
                    on_ready(i, k)
            if i:
                dz = dz @ self.layers[i][0].T
                dz *= acts[i] > 0
        return loss, correct

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch: int = 1024) -> tuple[float, int]:
        """Summed loss and number of correct predictions on ``(x, y)``."""
        loss, correct = 0.0, 0
        for a in range(0, len(y), batch):
            z = self.logits(x[a:a + batch])
            logp = _log_softmax(z)
            loss -= float(logp[np.arange(len(z)), y[a:a + batch]].sum())
            correct += int((z.argmax(axis=1) == y[a:a + batch]).sum())
        return loss, correct


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))
