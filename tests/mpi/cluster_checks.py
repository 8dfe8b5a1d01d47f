"""Multi-rank checks that only mean something across the hosts of an emulated cluster.

``tests/test_cluster.py`` runs this file inside ``bench/cluster.py run`` (which sets
``COLLECTIVES_CLUSTER``): ranks on several hosts, shared memory inside each, TCP over shaped links
between. The name does not match ``mpi_*.py``, so the ordinary multi-rank suite does not collect it;
given explicitly outside a cluster, every test skips.
"""

import os
from collections import Counter

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.algorithms.hierarchical import layout
from mpi_allreduce import _sweep
from reference import assert_close, make_input

pytestmark = pytest.mark.skipif("COLLECTIVES_CLUSTER" not in os.environ,
                                reason="not on an emulated cluster (bench/cluster.py run sets "
                                       "COLLECTIVES_CLUSTER; tests/test_cluster.py runs these)")

NUMPY = (lambda a: a), (lambda a: a)


def _hosts(comm):
    return comm.allgather(MPI.Get_processor_name())


def test_ranks_are_placed_host_by_host():
    comm = MPI.COMM_WORLD
    names = _hosts(comm)
    assert len(set(names)) >= 2, names
    order = [n for k, n in enumerate(names) if k == 0 or names[k - 1] != n]
    assert len(order) == len(set(names)), f"ranks not placed host by host: {names}"


def test_hierarchical_finds_the_hosts():
    """Split_type(COMM_TYPE_SHARED) finds the hosts: one node per host, holding its ranks."""
    comm = MPI.COMM_WORLD
    names = _hosts(comm)
    lay = layout(comm, None)
    try:
        mine = sorted(lay.node.allgather(comm.rank))
        assert mine == [r for r, n in enumerate(names) if n == names[comm.rank]]
        nodes = sum(comm.allgather(int(lay.node.rank == 0)))
        assert nodes == len(set(names))
        assert lay.m == min(Counter(names).values())
        if lay.cross is not None:  # one holder of this position on every host
            assert lay.cross.comm.size == nodes
    finally:
        lay.free()


@pytest.mark.parametrize("algorithm", list(collectives.ALGORITHMS))
def test_allreduce_sweep_across_hosts(algorithm):
    """Every algorithm, counts 0, 1, p-1, p+1, 1001, dtypes and ops by the covering design
    (``reference.sweep_cases``: a call over TCP costs the emulated network's latency), on the
    real nodes; "shm" (one node only) raises its clear error on every rank instead."""
    if algorithm == "shm":
        with pytest.raises(ValueError, match="needs every rank of the communicator on one"):
            collectives.allreduce(np.ones(5), algorithm="shm")
        return
    assert _sweep(algorithm, MPI.COMM_WORLD, collectives.Options(segment_bytes=24), NUMPY,
                  covering=True) > 0


@pytest.mark.parametrize("inter", list(collectives.algorithms.FLAT))
def test_hierarchical_large_odd_across_hosts(inter):
    comm = MPI.COMM_WORLD
    opts = collectives.Options(inter_algorithm=inter)
    for dtype in (np.dtype(np.float32), np.dtype(np.int64)):
        x = make_input(300_007, dtype, "sum", comm.rank)
        y = collectives.allreduce(x, algorithm="hierarchical", options=opts)
        assert_close(y, x, "sum", comm, f"hierarchical/{inter} {dtype}", identical=True)
