"""neighbor_allreduce(..., hierarchical=True): node mean through shared memory, gossip between
nodes, shared back (collectives/neighbor_hierarchical.py), over emulated nodes.

Against a plain NumPy reference built from the definition (gather every rank's array, take each
node's mean, mix the means with the node graph's weights read off the topology's blocks), not
from the library's own node matrix; the same bits on every rank of a node; the sum over ranks
kept on doubly stochastic graphs; in place and through the engine the same bits; bad input raised
on every rank.
"""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.decentralized import topology as T
from collectives._runtime.nodes import node_ids
from reference import gather_all

#: emulated node sizes (None: the real node, all ranks on one) and node graphs
CASES = [(None, "ring"), (1, "ring"), (2, "ring"), (3, "full"), (2, "torus")]


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


def _reference(x, topology, ids, comm):
    """Row ``rank`` of: node means (float64), mixed by ``V[a, b] = sum_{j in b} W[i, j]`` for
    the first rank ``i`` of node ``a``; with the rounding bound of the library's float sums."""
    rows = gather_all(x, comm).astype(np.float64).reshape(comm.size, -1)
    nodes = sorted(set(ids))
    members = [[r for r in range(comm.size) if ids[r] == a] for a in nodes]
    means = np.array([rows[m].mean(axis=0) for m in members])
    w = topology.weights()
    v = np.array([[w[m[0], mb].sum() for mb in members] for m in members])
    a = nodes.index(ids[comm.rank])
    ref = v[a] @ means
    eps = float(np.finfo(x.dtype).eps)
    bound = 4 * (comm.size + len(nodes)) * eps * (np.abs(v[a]) @ np.abs(means)
                                                   + np.abs(rows).max(axis=0))
    return ref.reshape(x.shape), bound.reshape(x.shape)


@pytest.mark.parametrize("node_size,inter", CASES)
def test_node_mean_then_node_mixing(comm, node_size, inter):
    """float64 and float32, odd counts (blocks of unequal size, and fewer elements than
    positions): within rounding of the reference, the same bits on every rank of a node, the
    sum over ranks kept, in place and through the engine the same bits."""
    opts = collectives.Options(node_size=node_size)
    ids = node_ids(comm, node_size)
    top = T.hierarchical_for(comm, inter, node_size=node_size)
    rng = np.random.default_rng(comm.rank)
    for dtype, shape in ((np.float64, (3, 7)), (np.float32, (2,))):
        what = f"{top.name} {np.dtype(dtype).name} {shape}"
        x = rng.standard_normal(shape).astype(dtype)
        y = collectives.neighbor_allreduce(x, top, hierarchical=True, comm=comm, options=opts)
        ref, bound = _reference(x, top, ids, comm)
        assert y.shape == x.shape and y.dtype == x.dtype, what
        assert (np.abs(y - ref) <= bound).all(), (what, np.abs(y - ref).max(), bound.max())
        everyone = gather_all(y, comm)
        for r in range(comm.size):
            if ids[r] == ids[comm.rank]:
                assert _same_bits(everyone[r].reshape(y.shape), y), (what, r)
        total_x = comm.allreduce(x.astype(np.float64).sum(), op=MPI.SUM)
        total_y = comm.allreduce(y.astype(np.float64).sum(), op=MPI.SUM)
        scale = comm.allreduce(float(np.abs(x).sum()), op=MPI.SUM)
        assert abs(total_y - total_x) <= 8 * comm.size * float(np.finfo(dtype).eps) * scale, what
        z = x.copy()
        collectives.neighbor_allreduce(z, top, hierarchical=True, out=z, comm=comm, options=opts)
        assert _same_bits(z, y), what
        req = collectives.ineighbor_allreduce(x, top, hierarchical=True, comm=comm, options=opts)
        assert _same_bits(req.wait(timeout=60), y), what


def _raises(call, text):
    with pytest.raises((ValueError, TypeError, collectives.CollectiveError)) as info:
        call()
    assert text in str(info.value), str(info.value)


def test_bad_input_raises_on_every_rank():
    """Combinations that make no sense, each raised on every rank before any message; then the
    communicator still works."""
    comm = MPI.COMM_WORLD
    p = comm.size
    opts = collectives.Options(node_size=2)
    top = T.hierarchical_for(comm, "ring", node_size=2)
    x = np.ones(6)
    run = collectives.neighbor_allreduce
    _raises(lambda: run(x, top, hierarchical=True, self_weight=0.5, options=opts),
            "self_weight= and weights= do not apply")
    _raises(lambda: run(x, top, hierarchical=True, backend="mpi", options=opts),
            "backend must be 'p2p'")
    _raises(lambda: run(x.astype(np.float16), top, hierarchical=True, options=opts),
            "float32 or float64, got float16")
    _raises(lambda: run(x, top, hierarchical=1, options=opts), "must be True or False")
    if p >= 4:  # ranks 0 and 1 share an emulated node but have different rows of the ring
        _raises(lambda: run(x, T.ring(p), hierarchical=True, options=opts),
                "different rows of W")  # (the ring of 3 is the full graph)
    y = run(np.full(4, float(comm.rank)), T.full(p), hierarchical=True, options=opts)
    assert np.allclose(y, (p - 1) / 2)
