"""The network a communicator's "auto" reasons about: the tuning file's entry and the cost model.

Both "auto"s read the same parameters: the allreduce's (``algorithms/auto.py``: the two-level
model across nodes, ``compressed/auto.py``: whether a codec pays) and the alltoall's
(``blocks/auto.py``: its formulas in :mod:`.alltoall_model`). The lookup lives on this floor so
that both can import it (``blocks/`` sits below ``algorithms/``):

- :func:`read_entry`: the tuning file's entry for the communicator's world size, read on rank 0
  and broadcast (collective; a malformed file is one warning on rank 0 and None everywhere), so
  that every rank decides from the same numbers;
- :func:`network_for`: the :class:`~.cost_model.Network` of an entry on ranks spread over
  ``nodes`` (ranks per node): across nodes the two-level model (:func:`cluster_model`), on one
  node the entry's fitted model, else the inside-node parameters of :data:`CLUSTER_DEFAULTS`.
"""

from __future__ import annotations

import warnings

from mpi4py import MPI

from .cost_model import Network
from .tuning_file import Entry, TuningFileError, entry_for

__all__ = ["CLUSTER_DEFAULTS", "read_entry", "cluster_model", "network_for"]

#: Two-level model parameters auto uses across nodes when no tuning file gives fitted ones:
#: shared memory inside a node (alpha, beta, gamma and alpha_native as fitted on one node,
#: docs/benchmarks.md, "Numbers behind the code"), a 10 Gbit/s TCP network between (25 us,
#: 0.8 ns/B).
CLUSTER_DEFAULTS = {"alpha": 1.4e-6, "beta": 5e-11, "gamma": 3e-11, "alpha_native": 8e-6,
                    "alpha_inter": 2.5e-5, "beta_inter": 8e-10}


def read_entry(comm: MPI.Comm, stacklevel: int = 3) -> Entry | None:
    """The tuning file's entry for ``comm.size``, the same on every rank (collective: rank 0
    reads, then broadcasts). A malformed file: one ``RuntimeWarning`` on rank 0, None."""
    entry, problem = None, None
    if comm.rank == 0:
        try:
            entry = entry_for(comm.size)
        except TuningFileError as exc:
            problem = str(exc)
    entry, problem = comm.bcast((entry, problem), root=0)
    if problem and comm.rank == 0:
        warnings.warn(f"ignoring the tuning file: {problem}; algorithm='auto' uses its "
                      "built-in rule", RuntimeWarning, stacklevel=stacklevel)
    return entry


def cluster_model(entry: Entry | None, nodes: list[int]) -> Network:
    """The two-level model across ``nodes``: the entry's fitted parameters where it has inter
    ones, else :data:`CLUSTER_DEFAULTS`; the smallest node as ``node_size``."""
    params = dict(CLUSTER_DEFAULTS)
    fitted = (entry.model or {}) if entry is not None else {}
    if fitted.get("alpha_inter") is not None or fitted.get("beta_inter") is not None:
        params = {k: v for k, v in fitted.items() if k != "node_size"}
    try:
        return Network(**{**params, "node_size": min(nodes)})
    except (TypeError, ValueError):  # a hand-edited model: fall back to the defaults
        return Network(**{**CLUSTER_DEFAULTS, "node_size": min(nodes)})


def network_for(entry: Entry | None, nodes: list[int]) -> Network:
    """The cost model of a communicator with these ``nodes`` (ranks per node) and tuning
    ``entry`` (read on rank 0 and broadcast, so the same on every rank): across nodes the
    two-level model "auto" chooses by; on one node the entry's fitted model, else the inside-node
    parameters of :data:`CLUSTER_DEFAULTS`."""
    if len(nodes) > 1:
        return cluster_model(entry, nodes)
    inter = ("alpha_inter", "beta_inter", "node_size")
    fitted = {k: v for k, v in ((entry.model or {}) if entry is not None else {}).items()
              if k not in inter}
    try:
        return Network(**fitted)
    except (TypeError, ValueError):  # none, or a hand-edited model: the defaults
        return Network(**{k: v for k, v in CLUSTER_DEFAULTS.items() if k not in inter})
