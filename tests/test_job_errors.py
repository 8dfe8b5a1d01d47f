"""An unhandled error on one rank ends the whole job promptly (issue 11, item 2).

Each program every rank runs (the SGD driver, the benchmarks, the tools) is started under mpiexec
as a subprocess with a timeout; an error only one rank sees must end every rank at once: one line
``PROG: error: rank R: TYPE: MESSAGE`` on the failing rank, then ``MPI_Abort`` (non-zero exit).
Before, the other ranks waited forever in their next message. Errors every rank sees (bad
arguments) stay one line and exit status 2, without an abort.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectives.launch import mpiexec_command as mpiexec

BIN = Path(sys.executable).parent
#: a job that does not end within this many seconds hangs (a healthy one ends in 2-5 s)
HANG_S = 60


def _job(n, argv, cwd=None):
    """Run ``argv`` on ``n`` ranks (no mpiexec for n = 0); (exit status, stderr, seconds).
    A hang is killed, with every process of the job, and fails the test."""
    cmd = [*mpiexec(), "-n", str(n), *argv] if n else argv
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        out, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} hung (killed after {HANG_S} s): {err[-2000:]}")
    return proc.returncode, out + err, time.monotonic() - t0


def _assert_aborted(result, prog, line):
    status, output, seconds = result
    lines = [x for x in output.replace("\r", "\n").splitlines() if f"{prog}: error:" in x]
    assert status != 0 and len(lines) == 1, output[-3000:]
    assert lines[0][lines[0].index(f"{prog}: error:"):].startswith(f"{prog}: error: {line}"), lines
    assert "Traceback" not in output, output[-3000:]


@pytest.fixture
def not_a_dir(tmp_path):
    """A path below a regular file: creating or writing it raises NotADirectoryError."""
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "x"


def test_sgd_error_on_rank_0_aborts_the_job(not_a_dir):
    # rank 0 writes the checkpoint, so only it raises; ranks 1-3 used to wait forever
    result = _job(4, [sys.executable, "-m", "collectives.sgd", "--subset", "200", "--epochs", "1",
                      "--hidden", "8", "--batch-size", "4", "--quiet",
                      "--checkpoint-dir", str(not_a_dir), "--checkpoint-every", "1"])
    _assert_aborted(result, "collectives.sgd", "rank 0: NotADirectoryError: [Errno 20]")


def test_benchmark_console_script_and_bench_script_abort(not_a_dir):
    tiny = ["-m", "8:64", "-i", "2", "-x", "1"]
    _assert_aborted(_job(3, [str(BIN / "osu_allreduce"), *tiny, "--json", f"{not_a_dir}.json"]),
                    "osu_allreduce", "rank 0: NotADirectoryError")
    repo = Path(__file__).resolve().parents[1]
    _assert_aborted(_job(2, [sys.executable, "bench/osu_bcast.py", *tiny, "--csv",
                             f"{not_a_dir}.csv"], cwd=repo), "osu_bcast",
                    "rank 0: NotADirectoryError")


def test_tools_end_with_one_line(tmp_path):
    _assert_aborted(_job(0, [str(BIN / "collectives-plot"), "--table", str(tmp_path / "no.json")]),
                    "collectives-plot", "rank 0: FileNotFoundError")


def test_errors_every_rank_sees_stay_exit_2_without_abort():
    status, output, _ = _job(2, [str(BIN / "osu_allreduce"), "-m", "8:64Q"])
    assert status == 2 and output.count("osu_allreduce: error: argument -m") == 1, output
    assert "Abort" not in output and "Traceback" not in output
