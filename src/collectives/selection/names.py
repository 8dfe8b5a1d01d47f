"""The names of the allreduce algorithms, as tuning files and the cost model spell them.

This layer names the algorithms and never imports them (``algorithms/`` sits above it and reads
it); ``tests/test_structure.py`` checks that these names are exactly the catalogue's.
"""

from __future__ import annotations

__all__ = ["FLAT_NAMES", "TUNABLE"]

#: The one-level algorithms (``algorithms.FLAT``), in the order the tools list them.
FLAT_NAMES = ("native", "ring", "tree", "recursive_doubling", "rabenseifner")
#: What a tuning rule may name: every algorithm of ``collectives.ALGORITHMS`` but "auto".
TUNABLE = FLAT_NAMES + ("hierarchical", "shm")
