"""Per-rank pytest runner with per-rank logs (the outer run's jobs use it; so may you).

Usage: ``mpiexec -n P python tests/mpi/runner.py LOGDIR [pytest args] [paths]``. Each rank sends
everything it prints to ``LOGDIR/rank<k>.log`` and runs ``pytest --with-mpi --mpi-log-dir LOGDIR``
(so ``LOGDIR/rank<k>.progress`` names the test under way and ``rank<k>.results`` holds its outcomes;
``tests/mpi_launch.py``) on the paths given, by default all of ``tests/mpi``. On a failure the rank
writes the traceback and aborts the job, so the other ranks cannot hang waiting;
``COLLECTIVES_TEST_NO_ABORT=1`` lets the ranks go on past a failure instead, to see every failure
of a run in one go (the GPU check does this, under a time limit: a failure seen by one rank only
can then leave the other waiting). Plain ``mpiexec -n P python -m pytest --with-mpi tests/mpi``
runs the same tests with every rank's output on the terminal.
"""

import os
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

HERE = Path(__file__).resolve().parent


def main() -> int:
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


if __name__ == "__main__":
    sys.exit(main())
