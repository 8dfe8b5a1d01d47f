"""Peak memory per rank, measured from the arrays a trainer actually holds, by category.

A :class:`MemoryLedger` watches arrays through weak references: :meth:`MemoryLedger.track` files
an array under one of :data:`CATEGORIES` when it is made, and the ledger samples, right then and
at every :meth:`MemoryLedger.sample`, the sum of ``nbytes`` of the tracked arrays still alive
(an array counts while anything, a view included, keeps it alive; once freed it drops out). The
peak of each category and of their sum is the largest sample. Arrays that only grow and live
for the whole run are counted through *probes* (a function giving bytes, read at
:meth:`MemoryLedger.report`): the collectives' scratch buffers (``_runtime.workspace``) and the
codec's state. The report adds the process's peak resident set size (``getrusage``), which also
holds the interpreter, MPI, the data set and activations.

Categories (ZeRO's accounting, Rajbhandari et al. 2020): ``parameters`` (full replicas, owned
shards and stage 3's gathered layers), ``master`` (stages 1-2 with a parameter codec: the
owner's full-precision slice beside the replica of decoded values), ``gradients`` (full
buffers, owned shards, buckets in flight), ``optimizer`` (the momentum), ``codec``
(error-feedback residuals and a codec's own state) and ``buffers`` (communication scratch and
staging copies).
"""

from __future__ import annotations

import resource
import sys
import weakref
from typing import Callable

import numpy as np

__all__ = ["CATEGORIES", "MemoryLedger", "peak_rss"]

#: what the ledger files arrays under, in report order
CATEGORIES = ("parameters", "master", "gradients", "optimizer", "codec", "buffers")


def peak_rss() -> int:
    """The process's peak resident set size in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class MemoryLedger:
    """Live bytes per category, and their peaks (the module docstring)."""

    def __init__(self) -> None:
        self._arrays: dict[str, dict[int, weakref.ref]] = {c: {} for c in CATEGORIES}
        self._bytes: dict[str, dict[int, int]] = {c: {} for c in CATEGORIES}
        self._probes: dict[str, list[Callable[[], int]]] = {c: [] for c in CATEGORIES}
        self.peak = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0

    def track(self, category: str, array: np.ndarray) -> np.ndarray:
        """File ``array`` (the array that owns its memory, not a view) under ``category`` and
        sample; returns ``array``."""
        if category not in self._arrays:
            raise ValueError(f"category must be one of {', '.join(CATEGORIES)}, got {category!r}")
        key = id(array)
        self._arrays[category][key] = weakref.ref(array)
        self._bytes[category][key] = int(array.nbytes)
        self.sample()
        return array

    def probe(self, category: str, fn: Callable[[], int]) -> None:
        """Count ``fn()`` bytes under ``category``, read at :meth:`report` (memory that lives
        from the first step to the end and only grows)."""
        self._probes[category].append(fn)

    def live(self) -> dict[str, int]:
        """Bytes of the tracked arrays alive now, per category (probes not included)."""
        out = {}
        for c, refs in self._arrays.items():
            dead = [k for k, ref in refs.items() if ref() is None]
            for k in dead:
                del refs[k], self._bytes[c][k]
            out[c] = sum(self._bytes[c].values())
        return out

    def sample(self) -> None:
        """Update the peaks with what is alive now."""
        now = self.live()
        for c, v in now.items():
            if v > self.peak[c]:
                self.peak[c] = v
        total = sum(now.values())
        if total > self.peak_total:
            self.peak_total = total

    def report(self) -> dict[str, int]:
        """Peak bytes per category (probes added), ``total`` (the peak of the tracked arrays'
        sum plus the probes) and ``rss`` (the process's peak resident set size)."""
        self.sample()
        probed = {c: sum(int(fn()) for fn in fns) for c, fns in self._probes.items()}
        out = {c: self.peak[c] + probed[c] for c in CATEGORIES}
        out["total"] = self.peak_total + sum(probed.values())
        out["rss"] = peak_rss()
        return out
