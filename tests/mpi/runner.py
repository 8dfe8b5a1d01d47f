"""Per-rank pytest runner with per-rank logs (the outer run's jobs use it; so may you).

Usage: ``mpiexec -n P python tests/mpi/runner.py LOGDIR [pytest args] [paths]``. Each rank sends
everything it prints to ``LOGDIR/rank<k>.log`` and runs ``pytest --with-mpi --mpi-log-dir LOGDIR``
(so ``LOGDIR/rank<k>.progress`` names the test under way and ``rank<k>.results`` holds its outcomes;
``tests/mpi_launch.py``) on the paths given, by default all of ``tests/mpi``. Where ``gdb``
exists a rank that crashes leaves a core file, which the outer run turns into the C backtrace of
the failure (``tests/backtrace.py``). On a failure the rank writes the traceback and aborts the
job, so the other ranks cannot hang waiting;
``COLLECTIVES_TEST_NO_ABORT=1`` lets the ranks go on past a failure instead, to see every failure
of a run in one go (the GPU check does this, under a time limit: a failure seen by one rank only
can then leave the other waiting). Plain ``mpiexec -n P python -m pytest --with-mpi tests/mpi``
runs the same tests with every rank's output on the terminal.

A rank ends without the interpreter's teardown (:func:`_end`): after the tests, the exit handlers
(the library's among them) and ``MPI_Finalize``, it flushes its output and leaves with
``os._exit``. Tearing down the modules the tests loaded (PyTorch above all) costs seconds of CPU
per rank, and the outer run (``tests/mpi_launch.py``) waits for each job to end, up to 30 s,
before it starts the next world size's.
"""

import atexit
import ctypes
import os
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from backtrace import allow_core  # noqa: E402  (tests/backtrace.py)


def main() -> int:
    allow_core()  # a crash leaves a core that the outer run reads with gdb
    logdir = Path(sys.argv[1])
    logdir.mkdir(parents=True, exist_ok=True)
    log = open(logdir / f"rank{MPI.COMM_WORLD.rank}.log", "w", buffering=1)
    os.dup2(log.fileno(), 1)  # before pytest starts capturing, so its report lands here too
    os.dup2(log.fileno(), 2)
    args = sys.argv[2:]
    valued = {"--rootdir", "-c", "--mpi-select", "--mpi-log-dir", "--basetemp"}
    paths = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1]
             not in valued) and (".py" in a or Path(a).is_dir())]
    return int(pytest.main(["--with-mpi", "--mpi-log-dir", str(logdir), "-q",
                            "-p", "no:cacheprovider", *args, *([] if paths else [str(HERE)])]))


def _end(code: int) -> None:
    """Exit handlers, ``MPI_Finalize`` (the library's wrapper: its engines stop first), flushed
    output, then ``os._exit(code)``: no module teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    if not MPI.Is_finalized():
        MPI.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # what C code printed (MPI's warnings) into stdio buffers
    os._exit(code)


if __name__ == "__main__":
    _end(main())
