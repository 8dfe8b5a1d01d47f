"""The progress engine's life at its edges, in real mpiexec jobs with timeouts.

Thread level (a clear error without MPI_THREAD_MULTIPLE), interpreter exit and MPI.Finalize with
requests in flight (waited, never a hang or a crash), an operation that can never complete at
exit (reported with the rank that did not submit it, then the job is aborted, not hung), and
the SGD driver's --overlap against the blocking exchange.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from collectives.tools.launch import mpiexec_command

TIMEOUT_S = 120


def _mpirun(tmp_path, n, body, *args):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return subprocess.run([*mpiexec_command(), "-n", str(n), sys.executable, str(script), *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=env)


def test_without_thread_multiple_the_first_nonblocking_call_says_so(tmp_path):
    proc = _mpirun(tmp_path, 2, """
        import sys
        import mpi4py
        mpi4py.rc.thread_level = "serialized"
        from mpi4py import MPI
        import numpy as np
        import collectives
        assert np.array_equal(collectives.allreduce(np.ones(3)), np.full(3, 2.0))  # blocking: fine
        try:
            collectives.iallreduce(np.ones(3))
        except RuntimeError as exc:
            sys.stdout.write(f"ERROR: {exc}\\n")  # one write: lines of two ranks do not mix
        y = collectives.iallreduce(np.ones(3), comm=MPI.COMM_SELF).wait()  # one rank: no thread
        sys.stdout.write(f"SELF {y.tolist()}\\n")
        """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("non-blocking collectives need MPI_THREAD_MULTIPLE") == 2, proc.stdout
    assert "initialised with MPI_THREAD_SERIALIZED" in proc.stdout
    assert proc.stdout.count("SELF [1.0, 1.0, 1.0]") == 2


def test_exit_and_finalize_with_requests_in_flight(tmp_path):
    """Requests never waited at exit, and requests in flight at an explicit MPI.Finalize, are
    completed; the job ends cleanly and promptly. MPI_Finalize called through a reference kept
    from before collectives was imported (unwrapped) is safe with idle engines, and with busy
    ones reports them and aborts instead of hanging or crashing inside MPICH."""
    body = """
        import sys
        import numpy as np
        from mpi4py import MPI
        unwrapped = MPI.Finalize
        import collectives
        comm = MPI.COMM_WORLD
        split = comm.Split(comm.rank % 2, comm.rank)
        reqs = [collectives.iallreduce(np.full(1 << 18, 1.0), algorithm=a, comm=c)
                for a in ("ring", "native") for c in (comm, split)]
        if sys.argv[1] == "finalize":
            MPI.Finalize()
            sys.stdout.write(f"finalized {all(r.test() for r in reqs)} "
                             f"{reqs[0].result[:2].tolist()}\\n")
        elif sys.argv[1].startswith("unwrapped"):
            if sys.argv[1] == "unwrapped-idle":
                collectives.waitall(reqs)
            unwrapped()
            sys.stdout.write("finalized unwrapped\\n")
        """
    for how in ("exit", "finalize", "unwrapped-idle"):
        proc = _mpirun(tmp_path, 3, body, how)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        if how == "finalize":
            assert proc.stdout.count("finalized True [3.0, 3.0]") == 3, proc.stdout
        if how == "unwrapped-idle":
            assert proc.stdout.count("finalized unwrapped") == 3, proc.stdout
        assert "cannot complete" not in proc.stderr
    proc = _mpirun(tmp_path, 3, body, "unwrapped-busy")
    assert proc.returncode != 0
    assert "MPI_Finalize was called with them in flight" in proc.stderr, proc.stderr[-3000:]


def test_an_operation_that_cannot_complete_is_reported_at_exit(tmp_path):
    proc = _mpirun(tmp_path, 2, """
        import time
        import numpy as np
        from mpi4py import MPI
        import collectives
        comm = MPI.COMM_WORLD
        collectives.iallreduce(np.ones(4)).wait()  # both engines are up
        if comm.rank == 0:
            time.sleep(8)  # alive, answering status queries, never submitting
        else:
            opts = collectives.Options(timeout=1.0)
            collectives.iallreduce(np.ones(4), algorithm="ring", options=opts)
        """)
    assert proc.returncode != 0
    assert "non-blocking operations that cannot complete at exit" in proc.stderr, proc.stderr
    assert "iallreduce #1" in proc.stderr and "rank(s) 0 have not submitted it" in proc.stderr, \
        proc.stderr


def test_sgd_overlap_trains_like_the_blocking_exchange(tmp_path):
    """--overlap (buckets started during backward) reaches the same accuracy as the fused
    blocking allreduce, and reports the communication it hid."""
    args = ["-m", "collectives.sgd", "--epochs", "4", "--quiet", "--hidden", "64,64"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    runs = {}
    for name, extra in (("blocking", []), ("overlap", ["--overlap", "--bucket-mb", "0.004"])):
        proc = subprocess.run([*mpiexec_command(), "-n", "3", sys.executable, *args, *extra,
                               "--log", str(tmp_path / f"{name}.json")], capture_output=True,
                              text=True, timeout=TIMEOUT_S, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = proc.stdout
    import json

    blocking = json.loads((tmp_path / "blocking.json").read_text())["summary"]
    overlap = json.loads((tmp_path / "overlap.json").read_text())["summary"]
    assert overlap["overlap"] and overlap["comm_busy"] > 0
    assert 0 <= overlap["comm_hidden"] <= overlap["comm_busy"]
    assert abs(overlap["test_acc"] - blocking["test_acc"]) <= 0.02
    assert overlap["bytes_mean"] == pytest.approx(blocking["bytes_mean"], rel=0.01)
    assert "hidden behind backward" in runs["overlap"]
