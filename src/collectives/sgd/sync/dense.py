"""``--sync sync`` (the default): synchronous SGD, the fused gradient averaged every step.

- Without a codec, one ``collectives.allreduce(grads, out=grads, op="avg", algorithm=...)``.
- With a codec, ``collectives.compressed_allreduce(grads, state, op="avg", key="grads",
  strategy=..., algorithm=...)`` on the whole fusion buffer, with the step in ``state.step``
  (``state`` is the run's :class:`collectives.CompressionState`). Codecs in :data:`LAYERWISE`
  compress matrices (PowerSGD factors ``M = P Q^T``), which a flat buffer is not, so for them
  every layer's gradient is reduced alone, as a view of the buffer, with key ``"grads.<i>"``.

With ``--overlap`` the gradient is averaged in buckets started *during* backward, through the
progress engine (``collectives.iallreduce``, or ``collectives.icompressed_allreduce`` with a
codec, key ``"grads.<layer>.<block>"``): each layer's gradient, its weight cut into blocks of rows
of at most ``--bucket-mb`` (PyTorch DDP's ``bucket_cap_mb``, 25 by default), is started as soon
as backward has written it, and the step waits for all of them before the update
(:class:`Buckets`). A bucket's encode and decode then run on the engine thread, not on the
critical path of backward. For the codecs of :data:`LAYERWISE` a bucket is its block of weight
rows as a matrix, and the last block's bias travels as a bucket of its own (key
``"... .bias"``). The report then says how much of the communication was hidden behind
backward: for each bucket, the part of its time on the engine that passed before the step began
to wait.

Bytes sent are those ``collectives.TRAFFIC`` counts, or, for ``algorithm="native"`` without a
codec (MPI's own messages), ``2 n (p-1)/p`` per exchange (what ring and Rabenseifner allreduce
send, the bandwidth lower bound).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

import collectives

from ...compressed import CompressionState
from ..fusion import FusionBuffer
from ..timing import Clock, time_methods
from .base import GOSSIP_DTYPE, SyncMode, dense_average, ring_bytes

__all__ = ["Synchronous", "Buckets", "LAYERWISE"]

#: codecs reduced layer by layer (they need each layer's matrix shape)
LAYERWISE = frozenset({"powersgd", "efsignsgd"})


class Buckets:
    """The gradient's overlap buckets: for each layer, blocks of weight rows (the last one
    followed by the bias), each a contiguous view of the fusion buffer, in backward order.
    ``parts[i][k]``: the (key, array) pairs block ``k`` of layer ``i`` is reduced as: the view
    itself, or (``matrices``) its weight rows as a matrix and, for the last block, the bias."""

    def __init__(self, grads: FusionBuffer, bucket_bytes: int, matrices: bool = False) -> None:
        self.rows: list[list[slice]] = []
        self.views: list[list[np.ndarray]] = []
        self.parts: list[list[list[tuple[str, np.ndarray]]]] = []
        offsets = grads.offsets
        for i in range(len(grads.shapes) // 2):
            fan_in, fan_out = grads.shapes[2 * i]
            per = max(1, bucket_bytes // (fan_out * grads.flat.itemsize))
            rows = [slice(a, min(a + per, fan_in)) for a in range(0, fan_in, per)]
            base = offsets[2 * i]
            views = [grads.flat[base + r.start * fan_out:base + r.stop * fan_out] for r in rows]
            weights = views[-1]
            views[-1] = grads.flat[base + rows[-1].start * fan_out:offsets[2 * i + 2]]  # + bias
            keys = [f"grads.{i}.{k}" for k in range(len(rows))]
            if matrices:
                parts = [[(key, v.reshape(-1, fan_out))] for key, v in zip(keys, views)]
                parts[-1] = [(keys[-1], weights.reshape(-1, fan_out)),
                             (keys[-1] + ".bias", grads.flat[offsets[2 * i + 1]:offsets[2 * i + 2]])]
            else:
                parts = [[(key, v)] for key, v in zip(keys, views)]
            self.rows.append(rows)
            self.views.append(views)
            self.parts.append(parts)

    def row_blocks(self, layer: int) -> list[slice]:
        return self.rows[layer]


class Synchronous(SyncMode):
    """Synchronous SGD: the gradient averaged every step (the module docstring).

    Parameters
    ----------
    state
        The compression state of this rank (codec, memories), or None for dense allreduce.
    algorithm, strategy
        Dense allreduce algorithm; compressed strategy ("auto" or a name in
        ``collectives.STRATEGIES``).
    bucket_bytes
        ``--overlap``: the largest bucket, in bytes; None: one exchange after backward.
    """

    name = "sync"
    forms = "'sync'"
    label = "sync"
    help = "'sync' (gradients averaged every step)"
    refuses = (GOSSIP_DTYPE,)

    def __init__(self, grads: FusionBuffer, params: FusionBuffer, comm: MPI.Comm,
                 clock: Clock | None = None, *, state: CompressionState | None = None,
                 algorithm: str = "ring", strategy: str = "auto",
                 bucket_bytes: int | None = None) -> None:
        super().__init__(grads, params, comm, clock)
        self.state, self.algorithm, self.strategy = state, algorithm, strategy
        self.analytic = algorithm == "native" and state is None
        if state is not None:
            for part in (state.codec, state.memory, state.server):
                if part is not None:
                    time_methods(part, self.clock, "codec")
        self.layerwise = state is not None and state.codec.name in LAYERWISE
        self.bucket_bytes = bucket_bytes
        self.buckets = None if bucket_bytes is None else \
            Buckets(grads, bucket_bytes, matrices=self.layerwise)
        self._requests: list = []
        self._sent0 = 0
        self._step = 0

    @classmethod
    def from_config(cls, cfg, value, grads, params, state, comm, clock) -> "Synchronous":
        a = cfg.args
        return cls(grads, params, comm, clock, state=state, algorithm=a.algorithm,
                   strategy=a.strategy,
                   bucket_bytes=int(a.bucket_mb * 2**20) if a.overlap else None)

    def backward_hooks(self, step: int) -> dict:
        """With ``--overlap``, the hooks that start each bucket's allreduce as backward
        finishes it; otherwise none."""
        if self.buckets is None:
            return {}
        self._sent0 = collectives.TRAFFIC.bytes_sent
        self._step = step
        return {"on_ready": self._start_bucket, "row_blocks": self.buckets.row_blocks}

    def __call__(self, step: int) -> None:
        if self.buckets is not None:
            self._wait_buckets()
            return
        self._timed(self.grads, step, self._reduce_grads)

    def _start_bucket(self, layer: int, block: int) -> None:
        if self.state is None:
            view = self.buckets.views[layer][block]
            self._requests.append(collectives.iallreduce(view, out=view, op="avg",
                                                         algorithm=self.algorithm, comm=self.comm))
            return
        for key, x in self.buckets.parts[layer][block]:
            self._requests.append(collectives.icompressed_allreduce(
                x, self.state, out=x, op="avg", strategy=self.strategy, comm=self.comm, key=key,
                step=self._step, algorithm=self.algorithm))

    def _wait_buckets(self) -> None:
        """--overlap: wait for this step's buckets; count what was hidden behind backward."""
        requests, self._requests = self._requests, []
        t0 = time.perf_counter()
        collectives.waitall(requests)
        st = self.stats
        st.seconds += time.perf_counter() - t0
        st.busy += sum(r.finished - r.started for r in requests)
        st.hidden += sum(max(0.0, min(r.finished, t0) - r.started) for r in requests)
        dense = ring_bytes(self.grads.flat.nbytes, self.comm.size)
        st.calls += 1
        st.dense_bytes += dense
        st.bytes_sent += dense if self.analytic else collectives.TRAFFIC.bytes_sent - self._sent0

    def _reduce_grads(self, buf: FusionBuffer, step: int) -> None:
        if self.state is None:
            dense_average(buf.flat, self.algorithm, self.comm)
            return
        self.state.step = step
        parts = (list(enumerate(buf.views)) if self.layerwise else [(None, buf.flat)])
        for i, x in parts:
            collectives.compressed_allreduce(
                x, self.state, out=x, op="avg", strategy=self.strategy, comm=self.comm,
                key="grads" if i is None else f"grads.{i}", algorithm=self.algorithm)
