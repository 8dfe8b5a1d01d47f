"""The cost model and the tuner: what "auto" reads, and how it is made.

- :mod:`~collectives.tuning.tuning_file`: the per-machine tuning file (where it is, its format,
  reading and writing it); ``algorithm="auto"`` reads it. Its names are re-exported here
  (``collectives.tuning.rules_for``, ...).
- :mod:`~collectives.tuning.cost_model`: the alpha-beta-gamma cost model of every allreduce
  algorithm (was ``collectives.model``).
- :mod:`~collectives.tuning.fit`: fitting the model's parameters from measurements on this machine
  (was ``collectives.fit``).
- :mod:`~collectives.tuning.tune`: ``collectives-tune``, which measures every algorithm and writes
  the tuning file (was ``collectives.tune``).
- :mod:`~collectives.tuning.projection`: ``collectives-project``, the model's prediction of which
  algorithm wins at 16 ... 4096 ranks (was ``collectives.project``).

Only the tuning file is imported with the package (auto needs it); the others on use.
"""

from .tuning_file import (
    ENV,
    FORMAT,
    VERSION,
    Entry,
    Rules,
    TuningFileError,
    clear_cache,
    default_path,
    entry_for,
    make_rules,
    read,
    read_entries,
    rules_for,
    tuning_path,
    write,
)

__all__ = ["ENV", "FORMAT", "VERSION", "TuningFileError", "Rules", "Entry", "default_path",
           "tuning_path", "read", "read_entries", "rules_for", "entry_for", "clear_cache",
           "make_rules", "write"]
