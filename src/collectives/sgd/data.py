"""Data sets and their deterministic split across ranks.

Every data set here ships inside an installed package (nothing is downloaded at run time) and is
returned as float32 features scaled to [0, 1] and int64 labels, split once into a training and a
test set by a fixed permutation, the same on every rank.

Sharding follows PyTorch's ``DistributedSampler``: at the start of epoch ``e`` every rank draws the
same permutation of the training set from ``default_rng((seed, e))``, drops the tail that does not
divide by the world size, and rank ``r`` takes positions ``r, r + p, r + 2p, ...``; it then cuts its
shard into batches of ``batch_size`` (the last, short batch is dropped). The order is a pure
function of ``(seed, epoch)``, so a checkpoint needs only the step to restore it. The test set is
evaluated whole, identically, on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

__all__ = ["DATASETS", "Dataset", "load", "shard", "steps_per_epoch"]

#: fraction of the samples held out for testing
TEST_FRACTION = 0.2
_SPLIT_SEED = 20240601


@dataclass(frozen=True)
class Dataset:
    """Train and test arrays of one data set."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int

    @property
    def features(self) -> int:
        return int(self.x_train.shape[1])


@lru_cache(maxsize=None)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # bundled with the scikit-learn wheel

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


@lru_cache(maxsize=None)
def _synthetic() -> tuple[np.ndarray, np.ndarray]:
    """20 000 samples of 64 features in 10 classes from scikit-learn's ``make_classification``
    (a fixed seed: the same everywhere, generated, not downloaded): digits' shape, 11x the
    samples, for batches large enough that compute weighs against communication."""
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=20000, n_features=64, n_informative=32, n_redundant=8,
                               n_classes=10, n_clusters_per_class=2, class_sep=1.5,
                               random_state=0)
    x = (x - x.min(axis=0)) / (x.max(axis=0) - x.min(axis=0))
    return x.astype(np.float32), y.astype(np.int64)


#: data set name -> loader returning (features, labels)
DATASETS: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {"digits": _digits,
                                                                      "synthetic": _synthetic}


def load(name: str, subset: int | None = None) -> Dataset:
    """Load ``name`` and split it; ``subset`` keeps only the first ``subset`` training samples."""
    x, y = DATASETS[name]()
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(y))
    n_test = int(round(TEST_FRACTION * len(y)))
    test, train = order[:n_test], order[n_test:]
    if subset is not None:
        train = train[:subset]
    return Dataset(name, x[train], y[train], x[test], y[test], int(y.max()) + 1)


def steps_per_epoch(n_train: int, world: int, batch_size: int) -> int:
    """Full batches per rank and epoch."""
    return (n_train // world) // batch_size


def shard(n_train: int, world: int, rank: int, seed: int, epoch: int) -> np.ndarray:
    """Indices of rank ``rank``'s training samples for ``epoch``, in visiting order."""
    perm = np.random.default_rng((seed, epoch)).permutation(n_train)
    usable = (n_train // world) * world
    return perm[:usable][rank::world]
