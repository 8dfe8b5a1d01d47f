"""From ``--codec NAME[:k=v,...]`` to the object handed to ``compressed_allreduce``.

- ``compress.parse_spec`` turns ``"topk:ratio=0.01"`` into ``("topk", {"ratio": 0.01})``; values
  become int, float or bool (``true``/``false``) when they read as one, else stay strings.
- Seeds follow what each codec declares (``randomness``). Codecs with *private* randomness (QSGD, TernGrad, natural
  compression, DGC's sampling) must draw independent noise on every rank, so each rank gets its own
  ``numpy.random.Generator`` from ``SeedSequence((seed, rank))``; the driver owns that generator and
  checkpoints its state. Codecs with *shared* randomness (random-k's indices, PowerSGD's initial Q)
  must agree across ranks, so they get the same integer seed on every rank. A ``seed=`` in the spec
  replaces ``--seed`` as the base seed.
- :func:`build` wraps the codec in :class:`compress.ErrorFeedback` when asked (by default when the
  codec declares ``needs_error_feedback``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import compress

__all__ = ["parse_spec", "build", "Built"]

parse_spec = compress.parse_spec

class Built:
    """A codec made for this rank: ``codec`` (maybe inside ErrorFeedback) and its generator."""

    def __init__(self, base: compress.Codec, wrapped: Any, rng: np.random.Generator | None):
        self.base = base
        self.codec = wrapped
        self.rng = rng

    @property
    def error_feedback(self) -> compress.ErrorFeedback | None:
        return self.codec if isinstance(self.codec, compress.ErrorFeedback) else None


def build(spec: str, *, error_feedback: bool | None, seed: int, rank: int) -> Built:
    """Instantiate ``spec`` for ``rank``; raises ValueError/TypeError on a bad name or parameter."""
    name, params = parse_spec(spec)
    if name not in compress.CODECS:
        raise ValueError(f"unknown codec {name!r}; valid names: {', '.join(compress.CODECS)}")
    base_seed = int(params.pop("seed", seed))
    rng = None
    randomness = compress.CODECS[name].randomness
    if randomness == "private":
        rng = np.random.default_rng(np.random.SeedSequence((base_seed, rank)))
        params["seed"] = rng
    elif randomness == "shared":
        params["seed"] = base_seed
    base = compress.get(name, **params)
    use_ef = base.needs_error_feedback if error_feedback is None else error_feedback
    return Built(base, compress.ErrorFeedback(base) if use_ef else base, rng)
