"""collectives.ParameterServer (stale-synchronous, over one-sided windows), at 1-8 ranks."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives


def _gradient(params, rank, step):
    """Integer-valued (exact in float64 whatever the order of the sums) and parameter-dependent."""
    return np.floor(params / 8) + (rank + 1) * (step % 3 + 1) + np.arange(params.size) % 5


def _synchronous(x0, p, steps, lr):
    params = x0.copy()
    for t in range(steps):
        params = params - lr * sum(_gradient(params, r, t) for r in range(p))
    return params


def test_staleness_zero_is_synchronous_sgd():
    comm = MPI.COMM_WORLD
    x0 = np.arange(1003, dtype=np.float64) * 4
    with collectives.ParameterServer(x0, staleness=0, lr=1.0, comm=comm,
                                     options=collectives.Options(timeout=60)) as ps:
        for t in range(6):
            params = ps.pull()
            if comm.rank == comm.size - 1:
                time.sleep(0.002)  # a slow worker: the others wait for it
            ps.push(_gradient(params, comm.rank, t))
        final = ps.pull()  # step 6: after every push of steps 0-5
    assert np.array_equal(final, _synchronous(x0, comm.size, 6, 1.0))


@pytest.mark.parametrize("staleness", [1, 3])
def test_no_worker_runs_more_than_s_steps_ahead(staleness):
    """Rank 0 is slow (sleeps every step): at every pull, the slowest worker has pushed at least
    step - s steps; the fast ones do run ahead (else the test would not test the bound)."""
    comm = MPI.COMM_WORLD
    x0 = np.zeros(11)
    ahead = []
    with collectives.ParameterServer(x0, staleness=staleness, lr=0.1, comm=comm,
                                     options=collectives.Options(timeout=60)) as ps:
        for t in range(8):
            params = ps.pull()
            ahead.append(t - ps.slowest)
            if comm.rank == 0:
                time.sleep(0.05)
            ps.push(np.ones_like(params))
        comm.Barrier()
        assert list(ps.clocks()) == [8] * comm.size
        assert np.allclose(ps.pull(), -0.1 * 8 * comm.size)  # every push arrived once
    assert max(ahead) <= staleness
    if comm.size > 1:  # some fast worker did run ahead of rank 0 (else the bound went untested)
        assert max(comm.allgather(max(ahead) if comm.rank else 0)) >= 1


def test_bad_input_and_timeout():
    comm = MPI.COMM_WORLD
    with pytest.raises(ValueError, match="staleness"):
        collectives.ParameterServer(np.zeros(4), staleness=-1 if comm.rank == 0 else 0, lr=0.1,
                                    comm=comm)
    with pytest.raises(TypeError, match="float32 or float64"):
        collectives.ParameterServer(np.zeros(4, np.int32), staleness=0, lr=0.1, comm=comm)
    ps = collectives.ParameterServer(np.zeros(4), staleness=1, lr=0.1, comm=comm,
                                     options=collectives.Options(timeout=0.2))
    with pytest.raises(ValueError, match="shape"):
        ps.push(np.zeros(5))
    if comm.size > 1:
        # rank 0 pulls step 2 while nobody else has pushed step 0: it times out naming a rank
        if comm.rank == 0:
            for _ in range(2):
                ps.push(ps.pull() * 0)
            with pytest.raises(TimeoutError, match=r"rank \d is at 0"):
                ps.pull()
        comm.Barrier()
    ps.free()
    with pytest.raises(ValueError, match="after free"):
        ps.pull()
