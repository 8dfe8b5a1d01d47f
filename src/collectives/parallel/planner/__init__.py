"""The planner: which split of the ranks (data x pipeline x tensor parallelism, micro-batches,
ZeRO stage, codec) trains a model fastest on a network, predicted without running it.

It composes the cost model's collective formulas (:mod:`collectives.selection.cost_model`) with
a compute model measured per layer on this machine (:mod:`.compute`), over the configurations
of :mod:`.config` placed on the hosts of :mod:`.network`; :mod:`.predict` holds the formulas
(docs/planner.md). Nothing in it sends a message. ``python -m collectives.plan`` is its command.

>>> from collectives.parallel import planner
>>> w = planner.Workload((64, 4096, 4096, 10), global_batch=256)
>>> cl = planner.cluster(ranks=8, hosts=2, rate="1gbit")
>>> best = planner.plan(w, cl, planner.MeasuredCompute())[0]   # the fastest Prediction
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .compute import (ComputeModel, FlopRate, MeasuredCompute, default_cache_path,
                      driver_form)
from .config import (SCHEDULES, Configuration, Workload, check, codec_of, configurations,
                     why_invalid)
from .network import Cluster, cluster, parse_rate
from .predict import Memory, Prediction, partition, predict

__all__ = ["plan", "Workload", "Configuration", "Cluster", "cluster", "parse_rate",
           "ComputeModel", "FlopRate", "MeasuredCompute", "default_cache_path", "driver_form",
           "Prediction",
           "Memory", "predict", "partition", "configurations", "why_invalid", "check",
           "SCHEDULES", "codec_of"]


def plan(w: Workload, cl: Cluster, compute: ComputeModel, codecs: Sequence[str] = ("none",),
         micro_factors: Sequence[int] = (1, 2, 4), schedule: str = "1f1b",
         algorithm: str = "ring", tuning: str | Path | None = None) -> list[Prediction]:
    """Every valid configuration's :class:`Prediction`, fastest first (ties: less memory)."""
    out = [predict(c, w, cl, compute, algorithm, tuning)
           for c in configurations(w, cl.ranks, codecs, micro_factors, schedule)]
    return sorted(out, key=lambda p: (p.step, p.memory.total))
