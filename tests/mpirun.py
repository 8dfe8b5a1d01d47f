"""Launching the multi-rank test suite under a real ``mpiexec``, with a timeout.

Each rank runs ``tests/mpi/runner.py``, which runs pytest on ``tests/mpi`` with its output in
``LOGDIR/rank<k>.log`` and the test it is in at ``LOGDIR/rank<k>.progress``. A failing test aborts
the whole job (so no rank waits forever on one that died); a hang is killed at the timeout. Either
way the error message names the test and shows each failing rank's traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from collectives.launch import mpiexec_command

HERE = Path(__file__).resolve().parent


def _tail(path: Path, lines: int = 60) -> str:
    if not path.exists():
        return "(no output)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def run_suite(nprocs: int, logdir: Path, timeout: float, *pytest_args: str) -> None:
    """Run the multi-rank suite on ``nprocs`` ranks; raise AssertionError on failure or hang."""
    cmd = [*mpiexec_command(), "-n", str(nprocs), sys.executable, str(HERE / "mpi" / "runner.py"),
           str(logdir), *pytest_args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        where = "\n".join(f"  rank {k}: {_tail(logdir / f'rank{k}.progress', 1)}"
                          for k in range(nprocs))
        raise AssertionError(f"{nprocs} ranks: timed out after {timeout:.0f} s (a hang?); "
                             f"each rank's last test:\n{where}\n"
                             f"rank 0 output:\n{_tail(logdir / 'rank0.log')}") from None
    if proc.returncode != 0:
        failed = [k for k in range(nprocs)
                  if "FAILED" in (logdir / f"rank{k}.log").read_text(errors="replace")] or [0]
        logs = "\n".join(f"--- rank {k} ---\n{_tail(logdir / f'rank{k}.log')}" for k in failed)
        raise AssertionError(f"{nprocs} ranks: exit code {proc.returncode}\n{logs}\n"
                             f"--- mpiexec ---\n{out[-3000:]}")
    summary = _tail(logdir / "rank0.log", 3)
    assert " passed" in summary and "no tests ran" not in summary, summary
