"""The training set's deterministic split across ranks (the data sets: :mod:`collectives.sgd.datasets`).

Sharding follows PyTorch's ``DistributedSampler``: at the start of epoch ``e`` every rank draws the
same permutation of the training set from ``default_rng((seed, e))``, drops the tail that does not
divide by the world size, and rank ``r`` takes positions ``r, r + p, r + 2p, ...``; it then cuts its
shard into batches of ``batch_size`` (the last, short batch is dropped). The order is a pure
function of ``(seed, epoch)``, so a checkpoint needs only the step to restore it. The test set is
evaluated whole, identically, on every rank.
"""

from __future__ import annotations

import numpy as np

__all__ = ["shard", "steps_per_epoch"]


def steps_per_epoch(n_train: int, world: int, batch_size: int) -> int:
    """Full batches per rank and epoch."""
    return (n_train // world) // batch_size


def shard(n_train: int, world: int, rank: int, seed: int, epoch: int) -> np.ndarray:
    """Indices of rank ``rank``'s training samples for ``epoch``, in visiting order."""
    perm = np.random.default_rng((seed, epoch)).permutation(n_train)
    usable = (n_train // world) * world
    return perm[:usable][rank::world]
