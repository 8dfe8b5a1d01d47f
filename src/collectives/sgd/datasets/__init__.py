"""The data sets shipped with the package (nothing is downloaded at run time).

``collectives.sgd.datasets.digits()`` returns the whole digits set as ``(features, labels)``;
:func:`load` splits a data set into training and test sets (a :class:`Dataset`), as the SGD driver
(``python -m collectives.sgd``) and the PyTorch trainer (``python -m collectives.torch.train``)
use them:

>>> from collectives.sgd import datasets
>>> x, y = datasets.digits()                  # (1797, 64) float32 in [0, 1], int64 labels
>>> ds = datasets.load("digits")              # ds.x_train, ds.y_train, ds.x_test, ds.y_test

Every set is float32 features scaled to [0, 1] and int64 labels.

``digits``: the 1797 8x8 images of the UCI "Optical Recognition of Handwritten Digits" test set
(Alpaydin & Kaynak 1998, CC BY 4.0; ``LICENSE-digits.txt`` beside this file), stored as
``digits.npz`` (uint8 counts 0..16 and labels). Loaded as ``counts / 16`` in float32, byte for byte
scikit-learn's ``load_digits()`` data over 16 (checked against :data:`DIGITS_SHA256`).
``synthetic``: 20 000 generated samples of digits' shape (:func:`_synthetic`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Callable

import numpy as np

__all__ = ["digits", "synthetic", "load", "Dataset", "DATASETS", "DIGITS_SHA256", "TEST_FRACTION"]

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


#: SHA-256 of the loaded (features, labels) bytes: those of scikit-learn's
#: ``(load_digits().data / 16.0).astype(np.float32)`` and ``load_digits().target`` (int64).
DIGITS_SHA256 = ("9f578524b6cec1fc800cc52dfc87ebe56264983d490aa72a4bd928ba2570ec77",
                 "a3c91c262eddcf7ba8f0e37507c30284493c9b20412ffe4af30d536401f7ba21")


@lru_cache(maxsize=None)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    with resources.files(__package__).joinpath("digits.npz").open("rb") as f, \
            np.load(f, allow_pickle=False) as z:
        images, labels = z["images"], z["labels"]
    x = (images.astype(np.float64) / 16.0).astype(np.float32)
    y = labels.astype(np.int64)
    got = tuple(hashlib.sha256(a.tobytes()).hexdigest() for a in (x, y))
    if got != DIGITS_SHA256:
        raise RuntimeError("collectives/datasets/digits.npz is damaged (its SHA-256 differs); "
                           "reinstall")
    return x, y


@lru_cache(maxsize=None)
def _synthetic() -> tuple[np.ndarray, np.ndarray]:
    """20 000 samples of 64 features in 10 classes, generated (not downloaded) from a fixed seed,
    the same everywhere: digits' shape, 11x the samples, for batches large enough that compute
    weighs against communication. Each class is two Gaussian clusters around vertices of a
    32-dimensional hypercube (side 3), in 32 informative features, 8 linear mixtures of them and
    24 noise features, scaled to [0, 1] per feature; 1 % of the labels are flipped at random."""
    rng = np.random.default_rng(20241130)
    n, classes, clusters, informative, redundant = 20000, 10, 2, 32, 8
    centres = rng.choice([-1.5, 1.5], size=(classes * clusters, informative))
    which = rng.integers(0, classes * clusters, n)
    x = np.empty((n, 64))
    x[:, :informative] = centres[which] + rng.standard_normal((n, informative))
    x[:, informative:informative + redundant] = \
        x[:, :informative] @ rng.uniform(-1, 1, (informative, redundant))
    x[:, informative + redundant:] = rng.standard_normal((n, 64 - informative - redundant))
    y = which % classes
    flip = rng.random(n) < 0.01
    y[flip] = rng.integers(0, classes, int(flip.sum()))
    x = (x - x.min(axis=0)) / (x.max(axis=0) - x.min(axis=0))
    return x.astype(np.float32), y.astype(np.int64)


def digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits data set, whole: ``(features, labels)``, 1797 rows of 64 float32 features in
    [0, 1] (8x8 images, counts over 16) and int64 labels 0-9, byte for byte scikit-learn's
    ``load_digits().data / 16`` and ``load_digits().target``. Fresh arrays at every call."""
    x, y = _digits()
    return x.copy(), y.copy()


def synthetic() -> tuple[np.ndarray, np.ndarray]:
    """The synthetic data set, whole: ``(features, labels)``, 20 000 rows of 64 float32 features
    in [0, 1] and int64 labels 0-9 (generated from a fixed seed; see :func:`_synthetic`). Fresh
    arrays at every call."""
    x, y = _synthetic()
    return x.copy(), y.copy()


#: data set name -> loader returning (features, labels), cached: the arrays are shared, read only
DATASETS: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {"digits": _digits,
                                                                      "synthetic": _synthetic}


def load(name: str, subset: int | None = None) -> Dataset:
    """Load ``name`` ("digits" or "synthetic") and split it into training and test sets by a fixed
    permutation, the same on every rank and in every run (:data:`TEST_FRACTION` of the samples
    held out); ``subset`` keeps only the first ``subset`` training samples."""
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; valid choices: {', '.join(DATASETS)}")
    x, y = DATASETS[name]()
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(y))
    n_test = int(round(TEST_FRACTION * len(y)))
    test, train = order[:n_test], order[n_test:]
    if subset is not None:
        train = train[:subset]
    return Dataset(name, x[train], y[train], x[test], y[test], int(y.max()) + 1)
