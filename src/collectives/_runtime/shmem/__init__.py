"""Shared-memory collectives on one node: MPI-3 shared windows, flags, Numba kernels.

``team.py`` runs a team's calls (the protocol, and why it is correct: docs/shm-protocol.md),
``layout.py`` holds the protocol's numbers, ``kernels/`` the Numba kernels (imported when a team
first runs), ``buffers.py`` the arrays of ``collectives.empty``/``zeros``. The ``shm`` algorithm
(``algorithms/shm.py``) and the intra-node half of ``hierarchical`` run on it.
"""

from .buffers import empty, zeros
from .team import Team

__all__ = ["empty", "zeros", "Team"]
