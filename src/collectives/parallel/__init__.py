"""Parallel training beyond plain data parallelism: NumPy-level building blocks above the
collectives and below the trainers, which the SGD driver and :mod:`collectives.torch` both use
(docs/architecture.md).

- :mod:`.pipeline`: pipeline parallelism, a schedule as data (GPipe, 1F1B), the executor that
  runs one stage's actions with non-blocking point-to-point, and the layer partitioner.
- :mod:`.tensor`: tensor (model) parallelism, Megatron-LM's column- and row-parallel linear
  layers on a mesh's tp axis (docs/parallelism.md).
- :mod:`.planner`: predicts the step time of every data x pipeline x tensor configuration of
  a model on a network, from the cost model and a measured compute model (no MPI traffic).
"""

__all__: list[str] = []
