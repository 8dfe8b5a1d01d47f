"""From ``--codec NAME[:k=v,...]`` to the object handed to ``compressed_allreduce``.

- ``compress.parse_spec`` turns ``"topk:ratio=0.01"`` into ``("topk", {"ratio": 0.01})``; values
  become int, float or bool (``true``/``false``) when they read as one, else stay strings.
- Seeds follow what each codec declares (``randomness``). Codecs with *private* randomness (QSGD, TernGrad, natural
  compression, DGC's sampling) must draw independent noise on every rank, so each rank gets its own
  ``numpy.random.Generator`` from ``SeedSequence((seed, rank))``; it is the codec's generator, in
  its ``state_dict()``. Codecs with *shared* randomness (random-k's indices, PowerSGD's initial Q)
  must agree across ranks, so they get the same integer seed on every rank. A ``seed=`` in the spec
  replaces ``--seed`` as the base seed.
- :func:`build` returns the :class:`collectives.CompressionState` the exchange passes to
  ``compressed_allreduce`` and the checkpoint saves, with :class:`compress.ErrorFeedback` around
  the codec when asked (by default when the codec declares ``needs_error_feedback``), or
  :class:`compress.DGCMemory` with ``--momentum-correction`` (DGC as published).
- ``auto:<spec>`` gives the same state with :class:`collectives.AutoCompression`: each exchange
  compresses only where the cost model predicts it pays (the report shows the decisions).
"""

from __future__ import annotations

import numpy as np

import compress

from ..compressed import AutoCompression, CompressionState
from ..compressed.auto import split_spec

__all__ = ["parse_spec", "build", "seeded"]

parse_spec = compress.parse_spec


def seeded(spec: str, *, seed: int, rank: int) -> compress.Codec:
    """The codec of ``spec`` for ``rank``, seeded as the module docstring says (also CHOCO-SGD's
    codec, ``--sync gossip:GRAPH --codec``); ValueError/TypeError on a bad name or parameter."""
    name, params = parse_spec(spec)
    if name not in compress.CODECS:
        raise ValueError(f"unknown codec {name!r}; valid names: {', '.join(compress.CODECS)}")
    base_seed = int(params.pop("seed", seed))
    randomness = compress.CODECS[name].randomness
    if randomness == "private":
        params["seed"] = np.random.default_rng(np.random.SeedSequence((base_seed, rank)))
    elif randomness == "shared":
        params["seed"] = base_seed
    return compress.get(name, **params)


def build(spec: str, *, error_feedback: bool | None, seed: int, rank: int,
          momentum_correction: dict | None = None, start_step: int = 0) -> CompressionState:
    """Instantiate ``spec`` for ``rank``; raises ValueError/TypeError on a bad name or parameter.
    ``momentum_correction``: the keyword arguments of a :class:`compress.DGCMemory` around the
    codec (DGC's momentum correction, warm-up and clipping) in place of error feedback.
    ``start_step``: the steps before it are dense (:class:`collectives.CompressionState`)."""
    inner = split_spec(spec)
    codec = seeded(spec if inner is None else inner, seed=seed, rank=rank)
    if momentum_correction is not None:
        state = CompressionState.of(compress.DGCMemory(codec, **momentum_correction))
    else:
        state = CompressionState.of(codec, error_feedback=error_feedback)
    state.start_step = start_step
    if inner is not None:
        state.auto = AutoCompression()
    return state
