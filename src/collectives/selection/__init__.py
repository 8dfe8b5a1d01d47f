"""What ``algorithm="auto"`` reads at run time to choose an algorithm.

- :mod:`~collectives.selection.tuning_file`: the per-machine tuning file (where it is, its format,
  reading and writing it); its names are re-exported here (``collectives.selection.entry_for``,
  ...). ``collectives-tune`` (:mod:`collectives.tools.tuning`) writes it.
- :mod:`~collectives.selection.cost_model`: the alpha-beta-gamma cost model of every allreduce
  algorithm, on one level or two; :func:`~collectives.selection.cost_model.from_tuning_file`
  gives the parameters ``collectives-tune`` fitted.
- :mod:`~collectives.selection.alltoall_model`: the same for every alltoall algorithm
  (``blocks/auto.py`` chooses by it);
- :mod:`~collectives.selection.network`: the parameters both "auto"s read for a communicator
  (the tuning file's entry, read on rank 0 and broadcast, and its fitted model or the built-in
  ``CLUSTER_DEFAULTS``);
- :mod:`~collectives.selection.names`: the algorithms' names; this layer never imports the
  algorithms themselves (``algorithms/auto.py`` and ``blocks/auto.py``, above it, do the
  choosing).

Only the tuning file is imported with the package; the cost models and the network lookup with
the alltoall's "auto" (``blocks/``), which ``import collectives`` imports.
"""

from .names import FLAT_NAMES, TUNABLE
from .tuning_file import (ENV, FORMAT, VERSION, Entry, Rules, TuningFileError, clear_cache,
                          codec_speeds, default_path, entry_for, make_rules, read,
                          read_codec_speeds, read_entries, rules_for, tuning_path, write)

__all__ = ["ENV", "FORMAT", "VERSION", "TuningFileError", "Rules", "Entry", "default_path",
           "tuning_path", "read", "read_entries", "rules_for", "entry_for", "clear_cache",
           "make_rules", "write", "codec_speeds", "read_codec_speeds", "FLAT_NAMES", "TUNABLE"]
