"""Parallel training beyond plain data parallelism: NumPy-level building blocks above the
collectives and below the trainers (docs/architecture.md).

- :mod:`.planner`: predicts the step time of every data x pipeline x tensor configuration of
  a model on a network, from the cost model and a measured compute model (no MPI traffic).
"""

__all__: list[str] = []
