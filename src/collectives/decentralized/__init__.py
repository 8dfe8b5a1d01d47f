"""Decentralized and asynchronous training: gossip over graphs instead of a global allreduce.

- :mod:`.topology`: communication graphs and their mixing weights (ring, torus, exponential,
  hierarchical ...), checked doubly stochastic.
- :mod:`.neighbor` and :mod:`.neighbor_hierarchical`: one gossip round
  (``neighbor_allreduce``, ``neighbor_allgather``), flat or node-aware.
- :mod:`.choco`: CHOCO-Gossip, compressed gossip with error-compensated copies.
- :mod:`.window`: one-sided windows (``Window``), the base of the asynchronous schemes.
- :mod:`.adpsgd`: AD-PSGD's pairwise averaging (``PairwiseAveraging``).
- :mod:`.ssp`: a parameter server with stale-synchronous parallelism (``ParameterServer``).

The public names are re-exported by :mod:`collectives`; docs/decentralized.md and
docs/asynchronous.md are the guides.
"""
