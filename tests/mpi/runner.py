"""Per-rank pytest runner for the multi-rank suite (started by ``tests/mpirun.py``).

Usage: ``mpiexec -n P python tests/mpi/runner.py LOGDIR [pytest args]``. Everything this rank
prints goes to ``LOGDIR/rank<k>.log``; ``LOGDIR/rank<k>.progress`` names the test under way. On a
failure the rank writes the traceback and aborts the job, so the other ranks cannot hang waiting.
``COLLECTIVES_TEST_NO_ABORT=1`` lets the ranks go on past a failure instead, to see every failure of
a run in one go (the GPU check does this, under a time limit: a failure seen by one rank only can
then leave the other waiting).
"""

import os
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

HERE = Path(__file__).resolve().parent


class _RankPlugin:
    def __init__(self, progress):
        self.progress = progress

    def pytest_runtest_logstart(self, nodeid, location):
        self.progress.write(f"in {nodeid}\n")
        self.progress.flush()

    def pytest_runtest_logreport(self, report):
        if report.failed:
            print(f"\nFAILED {report.nodeid} ({report.when}) on rank {MPI.COMM_WORLD.rank} "
                  f"of {MPI.COMM_WORLD.size}:\n{report.longreprtext}", flush=True)
            if not os.environ.get("COLLECTIVES_TEST_NO_ABORT"):
                MPI.COMM_WORLD.Abort(1)


def main() -> int:
    logdir = Path(sys.argv[1])
    logdir.mkdir(parents=True, exist_ok=True)
    rank = MPI.COMM_WORLD.rank
    log = open(logdir / f"rank{rank}.log", "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    progress = open(logdir / f"rank{rank}.progress", "w", buffering=1)
    args = ["-q", "-p", "no:cacheprovider", "-o", "python_files=mpi_*.py", "-o", "addopts=",
            "--rootdir", str(HERE), *sys.argv[2:], str(HERE)]
    code = pytest.main(args, plugins=[_RankPlugin(progress)])
    progress.write("done\n")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
