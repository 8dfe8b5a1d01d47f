"""An unhandled error on one rank ends the whole job promptly (issue 11, item 2).

Each program every rank runs (the SGD driver, the benchmarks, the tools) is started under mpiexec
as a subprocess with a timeout; an error only one rank sees must end every rank at once: one line
``PROG: error: rank R: TYPE: MESSAGE`` on the failing rank, then ``MPI_Abort`` (non-zero exit).
Before, the other ranks waited forever in their next message. Errors every rank sees (bad
arguments) stay one line and exit status 2, without an abort.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectives.tools.launch import mpiexec_command as mpiexec

BIN = Path(sys.executable).parent
#: a job that does not end within this many seconds hangs (a healthy one ends in 2-5 s)
HANG_S = 60


def _job(n, argv, cwd=None, env=None, merged=False):
    """Run ``argv`` on ``n`` ranks (no mpiexec for n = 0); (exit status, output, seconds): the
    output is stdout then stderr, or (``merged``) both in the order they came, in one pipe.
    A hang is killed, with every process of the job, and fails the test."""
    cmd = [*mpiexec(), "-n", str(n), *argv] if n else argv
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merged else subprocess.PIPE, text=True,
                            cwd=cwd, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    try:
        out, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} hung (killed after {HANG_S} s): {(err or out)[-2000:]}")
    return proc.returncode, out + (err or ""), time.monotonic() - t0


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


def test_benchmark_console_script_and_module_abort(not_a_dir):
    tiny = ["-m", "8:64", "-i", "2", "-x", "1"]
    _assert_aborted(_job(3, [str(BIN / "osu_allreduce"), *tiny, "--json", f"{not_a_dir}.json"]),
                    "osu_allreduce", "rank 0: NotADirectoryError")
    _assert_aborted(_job(2, [sys.executable, "-m", "collectives.tools.osu.bcast", *tiny, "--csv",
                             f"{not_a_dir}.csv"]), "osu_bcast", "rank 0: NotADirectoryError")


def test_tools_end_with_one_line(tmp_path):
    _assert_aborted(_job(0, [str(BIN / "collectives-plot"), "--table", str(tmp_path / "no.json")]),
                    "collectives-plot", "rank 0: FileNotFoundError")


def test_errors_every_rank_sees_stay_exit_2_without_abort():
    status, output, _ = _job(2, [str(BIN / "osu_allreduce"), "-m", "8:64Q"])
    assert status == 2 and output.count("osu_allreduce: error: argument -m") == 1, output
    assert "Abort" not in output and "Traceback" not in output


def _script(tmp_path, text):
    path = tmp_path / "script.py"
    path.write_text(text)
    return [sys.executable, str(path)]


def test_a_rank_that_raises_before_the_first_collective_ends_the_job(tmp_path):
    """Started with plain python (no ``-m mpi4py``): rank 1 raises before any collective while
    the others enter their first allreduce. ``import collectives`` makes the exception end the
    job at once (before, rank 1 waited in MPI_Finalize and the others in their first call, for
    ever), with one traceback: rank 1's."""
    argv = _script(tmp_path, "import numpy as np, collectives\nfrom mpi4py import MPI\n"
                             "if MPI.COMM_WORLD.rank == 1:\n"
                             "    raise RuntimeError('boom on rank 1')\n"
                             "collectives.allreduce(np.ones(4))\n")
    status, output, seconds = _job(4, argv)
    assert status != 0 and seconds < HANG_S, output[-3000:]
    assert output.count("Traceback") == 1 and "RuntimeError: boom on rank 1" in output, output
    assert "collectives: rank 1: unhandled RuntimeError: ending the job" in output, output


def test_an_error_every_rank_raises_is_printed_in_full_once(tmp_path):
    """Rank 2's bad dtype fails the allreduce on every rank (its notice): rank 2 prints its
    traceback, the others one line naming rank 2, and the job ends."""
    argv = _script(tmp_path, "import numpy as np, collectives\nfrom mpi4py import MPI\n"
                             "rank = MPI.COMM_WORLD.rank\n"
                             "collectives.allreduce(np.ones(4))  # contexts set up everywhere\n"
                             "x = np.array(['a'] * 4) if rank == 2 else np.ones(4)\n"
                             "collectives.allreduce(x)\n")
    status, output, seconds = _job(4, argv)
    assert status != 0 and seconds < HANG_S, output[-3000:]
    assert output.count("Traceback") == 1, output
    assert "collectives: rank 2: unhandled TypeError" in output, output


#: rank 0 misspells the algorithm; the others wait in the call for it (issue 50, item 2)
_TYPO = ("import numpy as np, collectives\nfrom mpi4py import MPI\n"
         "x = np.ones(10)\n"
         "alg = 'rnig' if MPI.COMM_WORLD.rank == 0 else 'ring'\n"
         "collectives.allreduce(x, algorithm=alg)\n")
_RANK_LINE = re.compile(r"collectives: rank (\d+): (.*)")
_BAD_NAME = "ValueError: unknown algorithm 'rnig'; valid choices: ring, tree,"


@pytest.mark.parametrize("asked", [False, True], ids=["default", "dump-asked"])
def test_an_argument_error_on_one_rank_is_printed_once_and_not_dumped(tmp_path, asked):
    """A bad argument on rank 0 of 4 (a misspelled algorithm): rank 0's traceback once, with
    the line that ends the job; at most one line on each other rank, naming rank 0 as the
    origin; MPICH's abort line (which the launcher, ending the job, does not always forward);
    nothing else. Every line is whole (written in one piece: never two
    ranks' lines run together; another rank's whole line may land between two lines of the
    traceback). The flight recorder does not dump for it (the traceback says it all) unless
    asked, and then says where once, not once per rank."""
    dumps = tmp_path / "dumps"
    env = {"COLLECTIVES_DUMP_DIR": str(dumps),
           "COLLECTIVES_DUMP_ON_ARGUMENT_ERROR": "1" if asked else "0"}
    status, output, seconds = _job(4, _script(tmp_path, _TYPO), cwd=tmp_path, env=env,
                                   merged=True)
    assert status != 0 and seconds < HANG_S, output[-3000:]
    lines = output.splitlines()
    assert all(line.count("collectives: rank") <= 1 for line in lines), output
    said: dict[int, list[str]] = {}
    traceback, aborts, other = [], [], []
    for line in lines:
        found = _RANK_LINE.fullmatch(line)
        if found:
            said.setdefault(int(found[1]), []).append(found[2])
        elif line.startswith("Abort(1) on node"):  # MPICH's, for the rank that calls MPI_Abort
            aborts.append(line)
        elif line == "Traceback (most recent call last):" or line.startswith("  ") \
                or line.startswith(_BAD_NAME):
            traceback.append(line)
        else:
            other.append(line)
    assert not other, output
    assert traceback[0].startswith("Traceback") and traceback[-1].startswith(_BAD_NAME), output
    assert sum(t.startswith("Traceback") for t in traceback) == 1, output
    assert sum(t.startswith(_BAD_NAME) for t in traceback) == 1, output
    announced = [r for r, texts in said.items() for t in texts if "flight recorder" in t]
    for rank, texts in said.items():
        said[rank] = [t for t in texts if "flight recorder" not in t]
    assert set(said) <= {0, 1, 2, 3} and 0 in said and len(said) > 1, output
    assert said.pop(0) == ["unhandled ValueError: ending the job (MPI_Abort; "
                           "COLLECTIVES_ABORT_ON_ERROR=0 to keep it running)"], output
    for rank, texts in said.items():  # one line each, naming rank 0, whose error it is
        assert len(texts) == 1, output
        assert texts[0].startswith(f"ValueError: allreduce #0 failed on rank 0: {_BAD_NAME}"), \
            output
    assert len(aborts) <= 1, output  # rank 0's: the others wait for it to end the job
    assert len(lines) == len(traceback) + 1 + len(said) + len(announced) + len(aborts), output
    jobs = list(dumps.glob("*")) if dumps.exists() else []
    if not asked:
        assert not announced and not jobs, (output, jobs)
    else:  # one folder for the job, every rank's dump in it, said once
        assert len(jobs) == 1 and len(announced) == 1, (output, jobs)
        assert sorted(p.name for p in jobs[0].glob("rank-*.json")) == \
            [f"rank-{r}.json" for r in range(4)], output
        assert f"to {jobs[0]}/" in output, output


@pytest.mark.parametrize("attempt", range(3))
def test_the_rank_named_as_printing_in_full_is_the_one_that_does(tmp_path, attempt):
    """Every rank of 4 fails on its own in one call (an op whose combine raises): each that
    learns of a lower rank's failure in time prints one line naming the rank that prints the
    traceback. It named the first lower rank whose notice came, which may itself defer to a
    still lower one ("rank 1 failed in this call too and prints it in full" where rank 0
    printed it: 3 runs in 10 before); now the lowest."""
    argv = _script(tmp_path, "import numpy as np, collectives\nfrom mpi4py import MPI\n"
                             "from collectives.ops import Op\n"
                             "def broken(lower, higher, out=None):\n"
                             "    raise RuntimeError(f'combine failed on rank "
                             "{MPI.COMM_WORLD.rank}')\n"
                             "collectives.allreduce(np.ones(4))  # contexts set up everywhere\n"
                             "collectives.allreduce(np.ones(4), op=Op('broken', broken, "
                             "MPI.SUM), algorithm='recursive_doubling')\n")
    status, output, seconds = _job(4, argv, merged=True)
    assert status != 0 and seconds < HANG_S, output[-3000:]
    assert output.count("Traceback") == 1, output
    full = re.findall(r"^collectives: rank (\d): unhandled RuntimeError: ending the job", output,
                      re.M)
    named = set(re.findall(r"\(rank (\d) failed in this call too and prints it in full\)",
                           output))
    assert len(full) == 1 and named <= set(full), output


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "ring", "tree"])
def test_a_size_mismatch_two_ranks_find_is_printed_in_full_once(tmp_path, algorithm):
    """Both ends of a message of the wrong size fail on their own in the same call: the lower
    rank prints its traceback (naming its array's size), the other at most one line."""
    argv = _script(tmp_path, "import sys, numpy as np, collectives\nfrom mpi4py import MPI\n"
                             "rank = MPI.COMM_WORLD.rank\n"
                             "collectives.allreduce(np.ones(4))  # contexts set up everywhere\n"
                             "x = np.ones(1000 + rank, np.float32)\n"
                             "collectives.allreduce(x, algorithm=sys.argv[1])\n")
    status, output, seconds = _job(2, [*argv, algorithm])
    assert status != 0 and seconds < HANG_S, output[-3000:]
    assert output.count("Traceback") == 1, output
    assert "rank 0 has 1000 elements of float32 (4000 bytes)" in output, output


def test_the_first_call_waits_at_most_the_timeout(tmp_path):
    """A rank that never makes its first call: the others' first call (which sets up the
    communicator's private duplicate) raises TimeoutError after Options.timeout."""
    argv = _script(tmp_path, "import time, numpy as np, collectives\nfrom mpi4py import MPI\n"
                             "if MPI.COMM_WORLD.rank == 1:\n"
                             "    time.sleep(HANG)\n"
                             "try:\n"
                             "    collectives.allreduce(np.ones(4),\n"
                             "                          options=collectives.Options(timeout=1))\n"
                             "except TimeoutError as exc:\n"
                             "    print('rank 0:', exc, flush=True)\n"
                             "    from collectives._runtime.cli import abort_world\n"
                             "    abort_world(3, delay=0.5)  # (MPI_Abort, no file left)\n"
                             .replace("HANG", str(HANG_S)))
    status, output, seconds = _job(2, argv)
    assert status != 0 and seconds < HANG_S / 2, output[-3000:]
    assert "rank 0: the first collective call on this communicator timed out after 1 s" \
        in output, output


def test_the_hooks_can_be_left_alone():
    code = ("import sys, threading; h, t = sys.excepthook, threading.excepthook\n"
            "import collectives\nprint(sys.excepthook is h, threading.excepthook is t)")
    for value, expected in (("0", "True True"), ("1", "False False")):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, env=dict(os.environ, COLLECTIVES_ABORT_ON_ERROR=value))
        assert run.stdout.split() == expected.split(), run.stderr


@pytest.mark.parametrize("attempt", range(3))
def test_ending_the_job_never_returns_to_the_program(tmp_path, attempt):
    """MPICH's MPI_Abort often returns while the launcher ends the job (about one job in two
    here): the rank then ran on into the program's next statement. Ours exits at once."""
    argv = _script(tmp_path, "import time\nfrom mpi4py import MPI\n"
                             "from collectives._runtime.cli import abort_world\n"
                             "MPI.COMM_WORLD.Barrier()\n"
                             "if MPI.COMM_WORLD.rank == 1:\n"
                             "    try:\n"
                             "        abort_world(3, delay=0)\n"
                             "    finally:\n"
                             "        print('returned', flush=True)\n"
                             "time.sleep(HANG)\n".replace("HANG", str(HANG_S)))
    status, output, seconds = _job(2, argv)
    assert status != 0 and seconds < HANG_S / 2, output[-3000:]
    assert "returned" not in output, output


# -- Options.on_error="abort" (collectives._runtime.abort_mode): any error in a call ends the job ------
def test_abort_mode_ends_the_job_even_when_the_error_is_caught(tmp_path):
    """In abort mode the other ranks wait in blocking MPI and cannot be told: rank 1's bad
    dtype ends the job although rank 1 catches it, with its traceback and one line."""
    argv = _script(tmp_path, "import numpy as np, collectives\nfrom mpi4py import MPI\n"
                             "rank = MPI.COMM_WORLD.rank\n"
                             "collectives.allreduce(np.ones(4))\n"
                             "x = np.array(['a'] * 4) if rank == 1 else np.ones(4)\n"
                             "try:\n"
                             "    collectives.allreduce(x)\n"
                             "except TypeError:\n"
                             "    pass\n"
                             "collectives.allreduce(np.ones(4))\n"
                             "print('survived', flush=True)\n")
    status, output, seconds = _job(3, argv, env={"COLLECTIVES_ON_ERROR": "abort"})
    assert status != 0 and seconds < HANG_S and "survived" not in output, output[-3000:]
    assert output.count("Traceback") == 1, output
    assert "collectives: rank 1: allreduce #" in output and \
        "failed on this rank: TypeError: x has unsupported dtype" in output, output


def test_ending_the_job_leaves_no_mpi_segment_in_dev_shm(tmp_path):
    """MPI_Abort leaves the MPI library's shared-memory files in /dev/shm (MPICH's
    ``mpich_shm_*``): memory held until the machine restarts. Ending the job removes the names
    of those the ending rank maps first (``_runtime/mpi_shm_files.py``): the ranks list what they map
    (the default allreduce's shared window too), rank 1 ends the job in abort mode, and none of
    them is left."""
    if not Path("/proc/self/maps").exists():
        pytest.skip("no /proc/self/maps: segments are removed on Linux only")
    argv = _script(tmp_path, "import numpy as np, collectives\nfrom mpi4py import MPI\n"
                             "from collectives._runtime.mpi_shm_files import mapped\n"
                             "rank = MPI.COMM_WORLD.rank\n"
                             "collectives.allreduce(np.ones(4))\n"
                             "with open(f'OUT/rank{rank}.txt', 'w') as f:\n"
                             "    f.write('\\n'.join(mapped()))\n"
                             "MPI.COMM_WORLD.Barrier()\n"
                             "collectives.allreduce(np.array(['a'] * 4) if rank == 1 else "
                             "np.ones(4))\n".replace("OUT", str(tmp_path)))
    status, output, seconds = _job(2, argv, env={"COLLECTIVES_ON_ERROR": "abort"})
    assert status != 0 and seconds < HANG_S, output[-3000:]
    listed = {p for f in tmp_path.glob("rank*.txt") for p in f.read_text().split()}
    if not listed:
        pytest.skip("this MPI library keeps no segment in /dev/shm")
    assert not [p for p in listed if os.path.exists(p)], (listed, output[-3000:])


def test_abort_mode_names_a_size_mismatch(tmp_path):
    argv = _script(tmp_path, "import numpy as np, collectives\nfrom mpi4py import MPI\n"
                             "o = collectives.Options(on_error='abort')\n"
                             "x = np.ones(1000 + MPI.COMM_WORLD.rank, np.float32)\n"
                             "collectives.allreduce(x, algorithm='ring', options=o)\n")
    status, output, seconds = _job(2, argv)
    assert status != 0 and seconds < HANG_S, output[-3000:]
    assert "count or dtype differs across ranks (this rank: 100" in output, output


def test_abort_mode_watchdog_ends_a_call_past_its_timeout(tmp_path):
    """Rank 2 never makes the call: the watchdog of ranks 0 and 1 ends the job after about 1 s
    (blocking MPI cannot time out by itself)."""
    argv = _script(tmp_path, "import time, numpy as np, collectives\nfrom mpi4py import MPI\n"
                             "o = collectives.Options(on_error='abort', timeout=1)\n"
                             "collectives.allreduce(np.ones(4), options=o)\n"
                             "if MPI.COMM_WORLD.rank == 2:\n"
                             "    time.sleep(HANG)\n"
                             "collectives.allreduce(np.ones(4), options=o)\n"
                             .replace("HANG", str(HANG_S)))
    status, output, seconds = _job(3, argv)
    assert status != 0 and seconds < HANG_S / 2, output[-3000:]
    assert "timed out after 1 s (Options.timeout)" in output, output


def test_abort_mode_names_a_native_mismatch(tmp_path):
    """Abort mode checks native's signature too (docs/reliability.md): a count that differs ends
    the job with the message naming every rank's count, not a wrong answer."""
    argv = _script(tmp_path, "import numpy as np, collectives\nfrom mpi4py import MPI\n"
                             "o = collectives.Options(on_error='abort')\n"
                             "x = np.ones(10 + (MPI.COMM_WORLD.rank > 0), np.float32)\n"
                             "y = collectives.allreduce(x, algorithm='native', options=o)\n"
                             "print('returned', y, flush=True)\n")
    status, output, seconds = _job(2, argv)
    assert status != 0 and seconds < HANG_S and "returned" not in output, output[-3000:]
    assert "arguments differ across ranks (count: rank 0: 10, rank 1: 11)" in output, output
