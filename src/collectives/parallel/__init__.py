"""Parallel training's building blocks, above the collectives and below the trainers: NumPy-level
pieces that the SGD driver and :mod:`collectives.torch` both use.

- :mod:`.pipeline`: pipeline parallelism, a schedule as data (GPipe, 1F1B), the executor that
  runs one stage's actions with non-blocking point-to-point, and the layer partitioner.
"""
