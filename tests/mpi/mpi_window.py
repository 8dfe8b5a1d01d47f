"""collectives.Window (one-sided, passive target) against plain arithmetic, at 1-8 ranks."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives


def test_concurrent_accumulates_sum_exactly(comm):
    """Every rank adds into every rank's window three times, all at once: integers sum exactly."""
    p, me = comm.size, comm.rank
    n = 1001
    with collectives.Window(np.zeros(n, np.int64), comm=comm) as win:
        mine = (me + 1) * np.arange(n, dtype=np.int64)
        for _ in range(3):
            for dest in range(p):
                win.accumulate(mine, dest, weight=2)
        comm.Barrier()  # every accumulate has completed at its target (unlock)
        value = win.update(self_weight=1)
        expected = 3 * 2 * (p * (p + 1) // 2) * np.arange(n, dtype=np.int64)
        assert np.array_equal(value, expected)
        assert win.weight == 1 + 3 * 2 * p
        comm.Barrier()
        got, weight = win.get((me + 1) % p)
        assert np.array_equal(got, expected) and weight == 1 + 3 * 2 * p


def test_push_sum_keeps_the_weights_and_converges():
    """Push-sum over a ring: each round every rank keeps half and puts half into its right
    neighbour. The sum of the weights stays p exactly; the estimates approach the average at the
    rate of the mixing matrix (I + P) / 2 (second eigenvalue cos(pi / p))."""
    comm = MPI.COMM_WORLD
    p, me = comm.size, comm.rank
    x0 = np.arange(5, dtype=np.float64) + 10.0 * me
    average = np.mean([np.arange(5) + 10.0 * r for r in range(p)], axis=0)
    with collectives.Window(x0, comm=comm) as win:
        for _ in range(12 * p):
            win.put(win.value, (me + 1) % p, weight=0.5)
            comm.Barrier()
            win.update(self_weight=0.5)
            comm.Barrier()
        weights = comm.allgather(win.weight)
        assert sum(weights) == p  # halves of powers of two: exact
        assert np.allclose(win.estimate, average, rtol=0, atol=1e-3 * (1 + average.max()))


def test_puts_land_while_the_target_computes(comm):
    """Rank 0 puts into every other rank while they sleep (no call of theirs): after a barrier
    their update sees it. The mailbox of a put is replaced, not added to."""
    p, me = comm.size, comm.rank
    with collectives.Window(np.zeros(3, np.float32), comm=comm, weight=0.0) as win:
        if me == 0:
            for dest in range(p):
                win.put(np.full(3, 7.0, np.float32), dest)
                win.put(np.full(3, 5.0, np.float32), dest)  # replaces the 7s
        else:
            MPI.Wtime(), __import__("time").sleep(0.05)
        comm.Barrier()
        assert np.array_equal(win.update(), np.full(3, 5.0, np.float32))
        assert win.weight == 1.0


def test_bad_input():
    comm = MPI.COMM_WORLD
    p = comm.size
    # a size that differs on one rank: every rank raises the same error, nothing allocated
    if p > 1:
        n = 4 + (comm.rank == p - 1)
        with pytest.raises(ValueError, match="arguments differ across ranks"):
            collectives.Window(np.zeros(n, np.float32), comm=comm)
    with pytest.raises(TypeError, match="cannot be accumulated"):
        collectives.Window(np.zeros(4, np.float16), comm=comm)
    with pytest.raises(TypeError, match="invalid arguments on rank 0"):
        collectives.Window(np.zeros((2, 2) if comm.rank == 0 else 4, np.float32), comm=comm)
    win = collectives.Window(np.zeros(4, np.int32), comm=comm)
    with pytest.raises(ValueError, match="shape"):
        win.put(np.zeros(5, np.int32), 0)
    with pytest.raises(ValueError, match="must be a rank"):
        win.accumulate(np.zeros(4, np.int32), p)
    with pytest.raises(ValueError, match="integer window"):
        win.accumulate(np.zeros(4, np.int32), 0, weight=0.5)
    win.free()
    with pytest.raises(ValueError, match="after free"):
        win.update()
    with pytest.raises(ValueError, match="after free"):
        win.get(0)


def test_access_from_another_thread_while_the_main_thread_computes():
    """A thread of each rank accumulates into every rank's window while the main thread
    computes (NumPy, then a sleep without MPI calls); the sums are exact."""
    import threading

    comm = MPI.COMM_WORLD
    p = comm.size
    with collectives.Window(np.zeros(257, np.int64), comm=comm) as win:
        ones = np.ones(257, np.int64)

        def send():
            for _ in range(2):
                for dest in range(p):
                    win.accumulate(ones, dest)

        worker = threading.Thread(target=send)
        worker.start()
        busy = np.random.default_rng(comm.rank).standard_normal((64, 64))
        for _ in range(10):
            busy = np.tanh(busy @ busy.T / 64)
        time.sleep(0.02)
        worker.join()
        comm.Barrier()
        assert np.array_equal(win.update(), np.full(257, 2 * p))
        assert win.weight == 1 + 2 * p
