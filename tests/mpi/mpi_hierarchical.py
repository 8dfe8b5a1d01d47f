"""Hierarchical allreduce with emulated nodes: equal and unequal sizes, every inner algorithm."""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.algorithms import FLAT
from reference import assert_close, make_input


#: the real node (one node: the inter algorithm never runs) with one inter algorithm; emulated
#: nodes of 1 to 4 ranks with each
NODES = [(None, next(iter(FLAT)))] + [(size, inter) for size in (1, 2, 3, 4) for inter in FLAT]


@pytest.mark.parametrize("node_size, inter", NODES)
def test_hierarchical_nodes(node_size, inter, comm):
    if -(-comm.size // node_size if node_size else 1) == 1 and inter != next(iter(FLAT)):
        pytest.skip("one node: the inter algorithm never runs (the first one's case covers it)")
    opts = collectives.Options(node_size=node_size, inter_algorithm=inter, segment_bytes=40,
                               shm_segment_bytes=64)  # many rounds through the node's window
    for count in (0, 1, comm.size + 1, 1001):
        for dtype, op in ((np.dtype(np.float32), "sum"), (np.dtype(np.int16), "max"),
                          (np.dtype(np.float64), "avg")):
            x = make_input(count, dtype, op, comm.rank)
            y = collectives.allreduce(x, op=op, algorithm="hierarchical", comm=comm, options=opts)
            what = f"node_size={node_size} inter={inter} n={count} {dtype} {op}"
            assert_close(y, x, op, comm, what, identical=True)


def test_node_size_from_environment(monkeypatch):
    comm = MPI.COMM_WORLD
    monkeypatch.setenv("COLLECTIVES_NODE_SIZE", "3")
    x = make_input(77, np.dtype(np.float64), "sum", comm.rank)
    y = collectives.allreduce(x, algorithm="hierarchical")
    assert_close(y, x, "sum", comm, "env node size")
    monkeypatch.setenv("COLLECTIVES_NODE_SIZE", "")


def test_layout_of_unequal_nodes():
    """Nodes of 3 ranks: the smallest node sets the number of positions; extras fold in."""
    from collectives.algorithms.hierarchical import layout

    comm = MPI.COMM_WORLD
    lay = layout(comm, 3)
    sizes = comm.allgather(lay.node.size)
    assert lay.m == min(sizes)
    assert (lay.holders != MPI.COMM_NULL) == (lay.node.rank < lay.m)
    if lay.cross is not None:
        assert lay.cross.comm.size == -(-comm.size // 3)  # one holder of this position per node
    lay.free()
