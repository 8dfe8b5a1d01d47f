"""The tools that make what ``algorithm="auto"`` reads (:mod:`collectives.selection`).

- :mod:`~collectives.tools.tuning.tune`: ``collectives-tune``, which measures every algorithm on this
  machine, fits the cost model and writes the tuning file.
- :mod:`~collectives.tools.tuning.fit`: fitting the cost model's parameters from measurements.
- :mod:`~collectives.tools.tuning.projection`: ``collectives-project``, the model's prediction of which
  algorithm wins at 16 ... 4096 ranks.

These sit on top of the library (they run collectives and benchmarks) and nothing below them
imports them; this package module imports none of them.
"""
