"""collectives.PairwiseAveraging (AD-PSGD's atomic pairwise average) against plain arithmetic,
at 1-8 ranks: the sum of the models is invariant, repeated averages reach the mean."""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.decentralized import topology


def _models(comm, n):
    """Every rank's initial model, integer-valued floats (sums and halvings are exact)."""
    return [((r * 7 + np.arange(n)) % 11).astype(np.float64) for r in range(comm.size)]


@pytest.mark.parametrize("graph", ["ring", "full"])
def test_concurrent_averages_keep_the_sum_exactly(comm, graph):
    """Every rank averages with four random neighbors, all at once, no barrier between: the sum
    over the ranks of the models equals the initial sum bit for bit (each pairwise average is
    atomic), and every model is still a mean of the initial ones (within their range)."""
    n = 33
    x0 = _models(comm, n)
    g = topology.build(graph, comm.size)
    with collectives.PairwiseAveraging(x0[comm.rank].copy(), g, comm=comm, seed=5) as pw:
        for step in range(4):
            pw.average(pw.peer(step))
        comm.Barrier()  # every average has completed at both windows (unlock)
        final = comm.allgather(pw.value)
        assert pw.averages == (4 if comm.size > 1 else 0)
    assert np.array_equal(np.sum(final, axis=0), np.sum(x0, axis=0))
    assert np.min(final) >= np.min(x0) and np.max(final) <= np.max(x0)


def test_repeated_averages_reach_the_mean(comm):
    """Thirty rounds on the full graph bring every model within 1e-3 of the initial mean (the
    sum is kept, so the mean is the one they started with); a delta is added on top exactly."""
    n = 16
    x0 = _models(comm, n)
    mean = np.mean(x0, axis=0)
    with collectives.PairwiseAveraging(x0[comm.rank].copy(), topology.full(comm.size),
                                       comm=comm) as pw:
        for step in range(30):
            pw.average(pw.peer(step))
        comm.Barrier()
        final = pw.value
        assert np.max(np.abs(final - mean)) < 1e-3 * (1 + np.abs(mean).max())
        comm.Barrier()
        got = pw.average(None, delta=np.full(n, 2.0))
        assert np.array_equal(got, final + 2.0) and np.array_equal(pw.value, got)


def test_peer_is_a_neighbor_and_a_function_of_the_step(comm):
    p, me = comm.size, comm.rank
    with collectives.PairwiseAveraging(np.zeros(3, np.float32), comm=comm, seed=1) as pw:
        peers = [pw.peer(s) for s in range(20)]
        assert peers == [pw.peer(s) for s in range(20)]
        if p == 1:
            assert peers == [None] * 20
        else:
            assert set(peers) <= {(me - 1) % p, (me + 1) % p}


def test_bad_input():
    comm = MPI.COMM_WORLD
    p = comm.size
    if p > 1:
        n = 4 + (comm.rank == p - 1)
        with pytest.raises(ValueError, match="arguments differ across ranks"):
            collectives.PairwiseAveraging(np.zeros(n, np.float32), comm=comm)
    with pytest.raises(TypeError, match="float32 or float64"):
        collectives.PairwiseAveraging(np.zeros(4, np.int32), comm=comm)
    if p >= 3:  # the one-peer exponential graph changes with the step from 3 ranks
        with pytest.raises(ValueError, match="static graph"):
            collectives.PairwiseAveraging(np.zeros(4), topology.one_peer_exponential(p),
                                          comm=comm)
    with pytest.raises(ValueError, match="is for"):
        collectives.PairwiseAveraging(np.zeros(4), topology.ring(p + 1), comm=comm)
    pw = collectives.PairwiseAveraging(np.zeros(4), comm=comm)
    with pytest.raises(ValueError, match="shape"):
        pw.average(None, delta=np.zeros(5))
    if p > 3:
        with pytest.raises(ValueError, match="not a neighbor"):
            pw.average((comm.rank + 2) % p)
    pw.free()
    with pytest.raises(ValueError, match="after free"):
        pw.average(None)
