"""Parallel training's building blocks, a floor above the collectives and the engine and below
the trainers (the NumPy driver, :mod:`collectives.torch`): tensor-parallel layers
(:mod:`.tensor`). docs/parallelism.md is the guide.
"""
