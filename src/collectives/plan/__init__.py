"""``python -m collectives.plan``: which data x pipeline x tensor split of the ranks trains the
SGD driver's model fastest on a network (the command; the model is
:mod:`collectives.parallel.planner`, docs/planner.md).

This floor sits above :mod:`collectives.sgd`: the command reads the driver's models, data sets
and parser.
"""

from .command import main

__all__ = ["main"]
