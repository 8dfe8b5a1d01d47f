"""collectives.ChocoGossip (CHOCO-GOSSIP, compressed gossip) against plain neighbor averaging and
the invariants of the algorithm, at 1-8 ranks."""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.decentralized import topology


def _start(comm, n, dtype=np.float64):
    return np.random.default_rng(100 + comm.rank).standard_normal(n).astype(dtype)


def _consensus(x, comm):
    mean = comm.allreduce(x, op=MPI.SUM) / comm.size
    return float(np.sqrt(comm.allreduce(float(np.sum((x - mean) ** 2)), op=MPI.SUM)
                         / comm.size)), mean


@pytest.mark.parametrize("graph", ["ring", "torus", "exponential"])
def test_identity_codec_with_gamma_one_is_neighbor_averaging(comm, graph):
    """codec "none", gamma 1: every round is neighbor_allreduce, to rounding, over three rounds
    (the public copy of a rank is its model as the round found it: everything was sent)."""
    g = topology.build(graph, comm.size)
    x = _start(comm, 50)
    plain = x.copy()
    choco = collectives.ChocoGossip(x, g, "none", 1.0, comm=comm)
    for t in range(3):
        before = x.copy()
        choco.step(x, step=t)
        plain = collectives.neighbor_allreduce(plain, g, comm=comm)
        assert np.allclose(x, plain, rtol=1e-12, atol=1e-12), t
        assert np.allclose(choco.hats[0], before, rtol=0, atol=1e-12)  # all was sent


@pytest.mark.world_sizes(1, 2, 3, 5)  # 5: a ring that is not a full graph, odd
def test_topk_keeps_the_mean_and_reaches_consensus(comm):
    """top-k (10 %) on the ring: the mean over ranks of x is the same after every round (W is
    doubly stochastic and symmetric), to float64 rounding; after 100 rounds with gamma 0.2 the
    consensus distance is below 2 % of its start (in a NumPy simulation of these rounds: 7e-3 at
    8 ranks, 1e-5 or less at 2-5; gamma 0.4 stalls near 5e-2 and 0.6 diverges)."""
    p = comm.size
    g = topology.ring(p)
    x = _start(comm, 40)
    start, mean0 = _consensus(x, comm)
    choco = collectives.ChocoGossip(x, g, "topk:ratio=0.1", gamma=0.2, comm=comm)
    for t in range(100):
        choco.step(x, step=t)
        if t % 50 == 49:
            _, mean = _consensus(x, comm)
            assert np.allclose(mean, mean0, rtol=0, atol=1e-12), t
    spread, _ = _consensus(x, comm)
    assert spread <= 0.02 * start or p == 1, (spread, start)


def test_bad_input():
    comm = MPI.COMM_WORLD
    p = comm.size
    x = np.zeros(8)
    with pytest.raises(ValueError, match="gamma"):
        collectives.ChocoGossip(x, topology.ring(p), "none", gamma=0.0, comm=comm)
    with pytest.raises(ValueError, match="depends on the data"):
        collectives.ChocoGossip(x, topology.ring(p), "threshold", comm=comm)
    with pytest.raises(ValueError, match="unknown codec|valid"):
        collectives.ChocoGossip(x, topology.ring(p), "bogus", comm=comm)
    with pytest.raises(TypeError, match="float32 or float64"):
        collectives.ChocoGossip(np.zeros(8, np.int32), topology.ring(p), comm=comm)
    if p >= 3:
        with pytest.raises(ValueError, match="static graph"):
            collectives.ChocoGossip(x, topology.one_peer_exponential(p), comm=comm)
    if p > 1:  # a gamma that differs on one rank: every rank raises the same error
        with pytest.raises(ValueError, match="arguments differ across ranks"):
            collectives.ChocoGossip(x, topology.ring(p), gamma=0.5 + 0.25 * (comm.rank == 0),
                                    comm=comm)
    choco = collectives.ChocoGossip(x, topology.ring(p), comm=comm)
    with pytest.raises(ValueError, match="shape"):
        choco.step(np.zeros(9))
