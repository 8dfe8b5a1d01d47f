"""Gradient and parameter exchange: what crosses the network each step.

Synchronous mode (``--sync sync``, the default) averages the fused gradient every step:

- without a codec, one ``collectives.allreduce(grads, out=grads, op="avg", algorithm=...)``;
- with a codec, ``collectives.compressed_allreduce(grads, state, op="avg", key="grads",
  strategy=..., algorithm=...)`` on the whole fusion buffer, with the step in ``state.step``
  (``state`` is the run's :class:`collectives.CompressionState`). Codecs in
  :data:`LAYERWISE` compress matrices (PowerSGD factors ``M = P Q^T``), which a flat buffer is not,
  so for them every layer's gradient is reduced alone, as a view of the buffer, with key
  ``"grads.<i>"``.

Local SGD (``--sync local:H``; Lin et al. 2020, *Don't Use Large Mini-Batches, Use Local SGD*)
skips the gradient exchange; every ``H`` steps the parameters are averaged with
``collectives.allreduce``. Momentum buffers stay local.

:class:`Exchange` also keeps the statistics of the report: seconds spent in the exchange, of which
encode/decode, and the bytes this rank sent, counted by ``collectives.TRAFFIC`` (the library's own
messages) or, for ``algorithm="native"`` without a codec, computed as ``2 n (p-1)/p`` bytes per
call (what ring and Rabenseifner allreduce send, the bandwidth lower bound).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mpi4py import MPI

import collectives

from ..compressed import CompressionState
from .fusion import FusionBuffer
from .timing import Clock, time_methods

__all__ = ["LAYERWISE", "Exchange", "parse_sync", "ring_bytes"]

#: codecs reduced layer by layer (they need each layer's matrix shape)
LAYERWISE = frozenset({"powersgd", "efsignsgd"})


def parse_sync(text: str) -> int:
    """``"sync"`` -> 0 (every step, gradients); ``"local:H"`` -> H >= 1 (parameters every H steps)."""
    if text == "sync":
        return 0
    kind, _, h = text.partition(":")
    if kind != "local" or not h.isdigit() or int(h) < 1:
        raise ValueError(f"--sync must be 'sync' or 'local:H' with an integer H >= 1, got {text!r}")
    return int(h)


def ring_bytes(n_bytes: int, world: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``n_bytes``: 2 n (p-1)/p (0 for one rank)."""
    return 2 * n_bytes * (world - 1) // world if world > 1 else 0


@dataclass
class Stats:
    """What the exchanges of this rank cost so far."""

    calls: int = 0
    seconds: float = 0.0
    bytes_sent: int = 0
    dense_bytes: int = 0      # what dense fp32 ring allreduce would have sent


class Exchange:
    """Averages gradients (or parameters) across ``comm`` as configured.

    Parameters
    ----------
    grads, params
        The model's fusion buffers.
    state
        The compression state for this rank (codec, memories), or None for dense allreduce.
    algorithm, strategy
        Dense allreduce algorithm; compressed strategy ("auto" or a name in
        ``collectives.STRATEGIES``).
    local_every
        0 for synchronous SGD, else H of local SGD.
    """

    def __init__(self, grads: FusionBuffer, params: FusionBuffer, state: CompressionState | None,
                 algorithm: str, strategy: str, local_every: int, comm: MPI.Comm,
                 clock: Clock) -> None:
        self.grads, self.params, self.state = grads, params, state
        self.algorithm, self.strategy, self.local_every = algorithm, strategy, local_every
        self.comm, self.clock = comm, clock
        self.stats = Stats()
        self.analytic = algorithm == "native" and state is None
        if state is not None:
            for part in (state.codec, state.memory, state.server):
                if part is not None:
                    time_methods(part, clock, "codec")
        self.layerwise = state is not None and state.codec.name in LAYERWISE

    def exchanges_at(self, step: int) -> bool:
        """Whether step ``step`` (0-based) ends with an exchange."""
        return not self.local_every or (step + 1) % self.local_every == 0

    def __call__(self, step: int) -> None:
        """Exchange after the local gradient of ``step`` is in ``grads`` (before the update)."""
        if self.local_every:
            return
        self._timed(self.grads, step, self._reduce_grads)

    def average_params(self, step: int) -> None:
        """Local SGD: average the parameters after the update of ``step``, when due."""
        if self.local_every and self.exchanges_at(step):
            self._timed(self.params, step, self._dense)

    # ------------------------------------------------------------------ internals
    def _timed(self, buf: FusionBuffer, step: int, fn) -> None:
        sent0 = collectives.TRAFFIC.bytes_sent
        t0 = time.perf_counter()
        fn(buf, step)
        self.stats.seconds += time.perf_counter() - t0
        nbytes = buf.flat.nbytes
        dense = ring_bytes(nbytes, self.comm.size)
        self.stats.calls += 1
        self.stats.dense_bytes += dense
        self.stats.bytes_sent += dense if self.analytic else collectives.TRAFFIC.bytes_sent - sent0

    def _dense(self, buf: FusionBuffer, step: int) -> None:
        collectives.allreduce(buf.flat, out=buf.flat, op="avg", algorithm=self.algorithm,
                              comm=self.comm)

    def _reduce_grads(self, buf: FusionBuffer, step: int) -> None:
        if self.state is None:
            self._dense(buf, step)
            return
        self.state.step = step
        parts = (list(enumerate(buf.views)) if self.layerwise else [(None, buf.flat)])
        for i, x in parts:
            collectives.compressed_allreduce(
                x, self.state, out=x, op="avg", strategy=self.strategy, comm=self.comm,
                key="grads" if i is None else f"grads.{i}", algorithm=self.algorithm)
