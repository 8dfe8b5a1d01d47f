"""Parallel training beyond plain data parallelism: NumPy-level building blocks above the
collectives and below the trainers (docs/architecture.md), for the SGD driver and
``collectives.torch``; they build no communicator of their own (they take ``comm=``).

- :mod:`.pipeline`: pipeline parallelism, a schedule as data (GPipe, 1F1B), the executor that
  runs one stage's actions with non-blocking point-to-point, and the layer partitioner.
- :mod:`.tensor`: tensor (model) parallelism, Megatron-LM's column- and row-parallel linear
  layers on a mesh's tp axis (docs/parallelism.md).
- :mod:`.planner`: predicts the step time of every data x pipeline x tensor configuration of
  a model on a network, from the cost model and a measured compute model (no MPI traffic).
- :mod:`.sharding`: :class:`ShardPlan`, which rank owns which flat slice (the ``counts`` of
  reduce-scatter and allgather), shared by the optimizer step, checkpoints and exchanges;
- :mod:`.zero`: ZeRO's stages (:data:`STAGES`) and :class:`Zero`, one rank's shards and their
  reduce-scatter and allgathers;
- :mod:`.prefetch`: stage 3's layer gathers as a schedule, started one ahead, the trailing
  layers' forward gathers kept for their backward where that adds no memory (:class:`LayerGather`);
- :mod:`.memory`: :class:`MemoryLedger`, peak bytes per rank by category, from the arrays held.
"""

from .memory import CATEGORIES, MemoryLedger, peak_rss
from .prefetch import BACKWARD, FORWARD, LayerGather, keep_for, live_peak, schedule
from .sharding import Piece, ShardPlan
from .zero import ALGORITHMS, STAGES, Stage, Stage1, Stage2, Stage3, Zero

__all__ = ["ShardPlan", "Piece", "STAGES", "Stage", "Stage1", "Stage2", "Stage3", "Zero",
           "ALGORITHMS", "LayerGather", "schedule", "keep_for", "live_peak", "FORWARD",
           "BACKWARD", "MemoryLedger", "CATEGORIES", "peak_rss"]
