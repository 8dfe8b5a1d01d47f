"""The multi-rank test machinery itself (tests/mpi_launch.py), on a probe suite at 2 ranks.

The outer run must give each multi-rank test its own item and outcome, report a failure on one
rank with that rank's traceback and go on with the next test, fail a hang with the test each rank
was in, fail a crash with the ranks' logs and the crashed thread's C frames (where gdb exists), refuse tests that exist only inside the ranks, honour -k and -x, run a test only at the
world sizes its ``world_sizes`` mark allows (all of them with --mpi-every-size), inside the ranks
too; and the real tests/mpi must run directly under mpiexec with pytest-mpi's --with-mpi.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import backtrace
from collectives.tools.launch import mpiexec_command

TESTS = Path(__file__).resolve().parent
CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
pytest_plugins = ["mpi_launch"]
import pytest
from mpi4py import MPI

@pytest.fixture(autouse=True)
def mpi_world_size(request):
    return getattr(request, "param", None) or MPI.COMM_WORLD.size
"""

PROBE = """
import time
import pytest
from mpi4py import MPI

@pytest.mark.parametrize("root", range(MPI.COMM_WORLD.size))  # 1 outside the ranks, 2 inside
def test_by_root(root):
    MPI.COMM_WORLD.Barrier()

def test_ok():
    MPI.COMM_WORLD.Barrier()

@pytest.mark.world_sizes(1, 3)
def test_not_at_two():
    MPI.COMM_WORLD.Barrier()

def test_hang():
    if MPI.COMM_WORLD.rank == 1:
        time.sleep(600)
    MPI.COMM_WORLD.Barrier()

def test_fails_on_rank_1():
    MPI.COMM_WORLD.Barrier()
    assert MPI.COMM_WORLD.rank != 1, "rank 1 disagrees"
    MPI.COMM_WORLD.Barrier()

def test_crashes_on_rank_1():
    MPI.COMM_WORLD.Barrier()
    if MPI.COMM_WORLD.rank == 1:
        import ctypes
        ctypes.string_at(0)  # a segmentation fault
    MPI.COMM_WORLD.Barrier()

def test_ok_after():
    MPI.COMM_WORLD.Barrier()
"""


def _outer(tmp_path, *args):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_probe.py").write_text(PROBE)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                          "--rootdir", str(tmp_path), str(tmp_path), "--mpi-world-sizes", "2",
                          "--mpi-timeout", "4", *args],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=dict(os.environ, TMPDIR=str(tmp_path)))  # failed jobs' logs here
    outcomes = {name: outcome for outcome, name in
                re.findall(r"^(PASSED|FAILED) test_probe.py::(\w+)\[(?:\w+-)?np2\]", run.stdout,
                           re.M)}
    return run, outcomes


def test_each_test_is_an_item_and_a_failing_or_hanging_rank_fails_only_its_test(tmp_path):
    run, outcomes = _outer(tmp_path)
    assert outcomes == {"test_by_root": "PASSED", "test_ok": "PASSED", "test_hang": "FAILED",
                        "test_fails_on_rank_1": "FAILED", "test_crashes_on_rank_1": "FAILED",
                        "test_ok_after": "PASSED"}, run.stdout
    assert "failed on rank 1 of 2: AssertionError: rank 1 disagrees" in run.stdout
    # a crash: each rank's log (faulthandler's Python frames) and, where gdb reads a core
    # written in the working directory, the crashed thread's C frames (tests/backtrace.py)
    assert "were in this test (a crash?)" in run.stdout and "Segmentation fault" in run.stdout
    if backtrace.enabled() and CORE_PATTERN.read_text().startswith("core"):
        assert "C backtrace of the crashed thread" in run.stdout, run.stdout[-4000:]
        assert "string_at" in run.stdout, run.stdout[-4000:]
        assert not list(tmp_path.glob("core*")), "the core was not deleted"
    assert "no rank finished anything for 4 s (a hang?)" in run.stdout
    assert "rank 1: test_probe.py::test_hang[np2]" in run.stdout
    # a test whose parameters depend on the world size cannot hide inside the ranks
    assert "exist only inside the ranks (NOT run)" in run.stdout
    assert "test_probe.py::test_by_root[1-np2]" in run.stdout
    # world_sizes(1, 3) at --mpi-world-sizes 2: deselected outside, and inside the ranks too
    assert "test_not_at_two" not in run.stdout and "1 deselected" in run.stdout


def test_k_and_x_and_every_size_reach_the_ranks(tmp_path):
    run, outcomes = _outer(tmp_path, "-k", "not hang and not by_root", "-x", "--mpi-every-size")
    assert outcomes == {"test_ok": "PASSED", "test_not_at_two": "PASSED",
                        "test_fails_on_rank_1": "FAILED"}, run.stdout
    assert "1 failed, 2 passed, 2 deselected" in run.stdout  # -x: test_ok_after never ran


def test_after_mpi_serial_tests_run_after_the_multi_rank_jobs(tmp_path):
    """Serial tests run before the multi-rank jobs, but those marked ``after_mpi`` (the emulated
    clusters, whose ranks then find the kernels the jobs compiled) run after them."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    plugin = 'pytest_plugins = ["mpi_launch"]\n'
    head, fixture = CONFTEST.split(plugin)  # the plugin at the root, the world-size fixture in mpi/
    (tmp_path / "conftest.py").write_text(head + plugin)
    (tmp_path / "mpi").mkdir()
    (tmp_path / "mpi" / "conftest.py").write_text(fixture)
    (tmp_path / "mpi" / "test_ranks.py").write_text("def test_ranks():\n    pass\n")
    (tmp_path / "test_serial.py").write_text(
        "import pytest\n\n@pytest.mark.after_mpi\ndef test_late():\n    pass\n\n"
        "def test_early():\n    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                          "--collect-only", "-q", "--rootdir", str(tmp_path), str(tmp_path),
                          "--mpi-world-sizes", "2,3"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    order = [line for line in run.stdout.splitlines() if "::" in line]
    assert order == ["test_serial.py::test_early", "mpi/test_ranks.py::test_ranks[np2]",
                     "mpi/test_ranks.py::test_ranks[np3]", "test_serial.py::test_late"], run.stdout


def test_the_suite_runs_directly_under_mpiexec_with_pytest_mpi():
    cmd = [*mpiexec_command(), "-n", "2", sys.executable, "-m", "pytest", "--with-mpi", "-q",
           "-rA", "-p", "no:cacheprovider", "tests/mpi", "-k", "test_mpi_op_objects_match_names"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=TESTS.parent)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    # each rank ran the one test, with the world size in its id
    passed = "PASSED tests/mpi/mpi_allreduce.py::test_mpi_op_objects_match_names[np2]"
    assert run.stdout.count(passed) == 2, run.stdout[-3000:]
