"""Hangs for the flight recorder's tests (tests/test_flight_recorder.py), run on 3 ranks:
``mpiexec -n 3 python tests/flight_hangs.py OUTDIR``.

Each scenario runs on a communicator of its own (freed at its end, so the next scenario's dumps
hold only its own calls) and dumps into ``OUTDIR/<scenario>`` (in the job's folder there,
``OUTDIR/<scenario>/<job id>/rank-<R>.json``); rank 0 prints ``done`` at the end.
Every call after the first three has ``Options(timeout=1)``: a hang is a timeout, and the
timeout dumps.

- ``skip``: rank 2 skips one allreduce; its next one pairs with the others' skipped one, and the
  others then wait for an allreduce rank 2 never makes (it waits at the end, dumping on SIGUSR1
  from rank 0, as ``kill -USR1`` would).
- ``different``: rank 1 calls bcast where the others call allreduce.
- ``count``: rank 2 passes 1000 elements where the others pass 1024 (no validate): the guard's
  ValueError on every rank, caught, then an explicit ``flight_recorder.dump()``.
- ``compute``: rank 2 computes (sleeps) for 3 s before its call: the others time out, rank 2
  dumps on SIGUSR1 while it sleeps, then meets their notice.
- ``named``: ranks 0 and 1 wait for a named ``iallreduce`` that rank 2 submits 1.5 s late; their
  stall warning (``Options.stall_warning``) dumps, and says what rank 2 did last (rank 0 prints
  it).
- ``off``: the recorder off (``COLLECTIVES_FLIGHT_RECORDER=0``): rank 2 skips a call, the others
  time out, and nobody dumps.
- ``crash`` (last): rank 1 raises, unhandled: the crash hook dumps, then ends the job.

Two more end the job, so they run only when named (``... OUTDIR abort-timeout``), one per run:

- ``abort-timeout``: ``Options(on_error="abort", timeout=1)``; rank 2 skips a call: the watchdog
  of ranks 0 and 1 dumps (reason "timeout") and ends the job.
- ``abort-error``: ``Options(on_error="abort")``; rank 1 passes a bool array (TypeError): its
  abort-mode runner dumps (reason "argument error", with COLLECTIVES_DUMP_ON_ARGUMENT_ERROR=1)
  and ends the job.
"""

import os
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from mpi4py import MPI

import collectives
from collectives.diagnostics import flight_recorder

flight_recorder.QUIET_S = 0.0  # every scenario's automatic dump writes
WORLD = MPI.COMM_WORLD
RANK = WORLD.rank
PIDS = WORLD.allgather(os.getpid())
OPTS = collectives.Options(timeout=1)
OUT = Path(sys.argv[1])


def settle(comm):
    """Every rank reaches this point (polling: a rank here still answers SIGUSR1)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.01)


def signal_rank(rank, scenario):
    """Rank 0: make ``rank`` dump (SIGUSR1) and wait until its file is there."""
    os.kill(PIDS[rank], signal.SIGUSR1)
    end = time.monotonic() + 20
    while not list((OUT / scenario).glob(f"*/rank-{rank}.json")) and time.monotonic() < end:
        time.sleep(0.01)


def steps(comm, n, x, options=OPTS):
    for _ in range(n):
        collectives.allreduce(x, out=x, comm=comm, options=options)


def warm(comm, x):
    """Calls #0-#2 on every rank, without a timeout (the first sets the communicator up)."""
    steps(comm, 3, x, None)


def skip(comm):
    x = np.ones(1024, np.float32)
    warm(comm, x)
    try:
        steps(comm, 2 if RANK == 2 else 3, x)  # rank 2 makes one call fewer
    except TimeoutError:
        pass
    if RANK == 0:
        signal_rank(2, "skip")


def different(comm):
    x = np.ones(1024, np.float32)
    warm(comm, x)
    try:
        if RANK == 1:
            collectives.bcast(x, comm=comm, options=OPTS)
        else:
            collectives.allreduce(x, out=x, comm=comm, options=OPTS)
    except TimeoutError:
        pass


def count(comm):
    warm(comm, np.ones(1024, np.float32))
    x = np.ones(1000 if RANK == 2 else 1024, np.float32)
    try:
        collectives.allreduce(x, algorithm="ring", comm=comm, options=OPTS)
    except ValueError as exc:
        print(f"rank {RANK}: {exc}", flush=True)
    flight_recorder.dump()


def compute(comm):
    x = np.ones(1024, np.float32)
    warm(comm, x)
    if RANK == 2:
        time.sleep(3.0)  # compute, beyond the others' timeout
    elif RANK == 0:
        try:
            steps(comm, 1, x)
        except TimeoutError:
            signal_rank(2, "compute")
        return
    try:
        steps(comm, 1, x)
    except TimeoutError:
        pass


def named(comm):
    x = np.ones(256, np.float32)
    collectives.iallreduce(x, out=x, comm=comm).wait()  # the engine, made by every rank
    opts = collectives.Options(stall_warning=0.5)
    if RANK == 2:
        time.sleep(1.5)
        flight_recorder.dump()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", collectives.StallWarning)
        collectives.iallreduce(x, out=x, comm=comm, name="grad.fc1", options=opts).wait()
    if RANK == 0:
        print(f"stall warning: {caught[0].message}", flush=True)


def off(comm):
    """The recorder off (COLLECTIVES_FLIGHT_RECORDER=0, read when the communicator's guard is
    made): a timeout dumps nothing."""
    x = np.ones(16, np.float32)
    warm(comm, x)
    try:
        if RANK != 2:
            steps(comm, 1, x)
    except TimeoutError:
        if RANK == 0:
            print("off: timed out", flush=True)


def crash(comm):
    x = np.ones(16, np.float32)
    warm(comm, x)
    if RANK == 1:
        raise RuntimeError("boom on rank 1")
    time.sleep(30)  # ended by rank 1's MPI_Abort


ABORT = collectives.Options(on_error="abort", timeout=1)


def abort_timeout(comm):
    x = np.ones(1024, np.float32)
    warm(comm, x)
    steps(comm, 0 if RANK == 2 else 1, x, ABORT)  # ranks 0, 1: the watchdog ends the job
    time.sleep(30)


def abort_error(comm):
    x = np.ones(16, np.float32)
    options = collectives.Options(on_error="abort")  # no timeout: rank 1's error ends the job
    warm(comm, x)
    steps(comm, 1, np.ones(16, bool) if RANK == 1 else x, options)
    time.sleep(30)


SCENARIOS = {"skip": skip, "different": different, "count": count, "compute": compute,
             "named": named, "off": off, "crash": crash}
NAMED_ONLY = {"abort-timeout": abort_timeout, "abort-error": abort_error}

for name, scenario in {**SCENARIOS, **NAMED_ONLY}.items():
    if (name not in sys.argv[2].split(",")) if len(sys.argv) > 2 else name in NAMED_ONLY:
        continue
    os.environ["COLLECTIVES_DUMP_DIR"] = str(OUT / name)
    os.environ["COLLECTIVES_FLIGHT_RECORDER"] = "0" if name == "off" else "2000"
    comm = WORLD.Dup()
    if name == "crash" and RANK == 0:
        print("done", flush=True)
    scenario(comm)
    settle(comm)
    comm.Free()
