"""The flight recorder and ``python -m collectives doctor`` (issue 28).

Hangs run for real: ``tests/flight_hangs.py`` on 3 ranks under mpiexec (one job for every
scenario, killed if it hangs), then the doctor reads each scenario's dumps and must print the
expected one-line diagnosis. The ring buffer and the doctor's rules are tested alone too, the
doctor on dumps written by hand.
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.diagnostics import doctor, flight_recorder
from collectives._runtime import flight
from collectives.tools.launch import mpiexec_command as mpiexec

HERE = Path(__file__).resolve().parent
HANG_S = 90


# -- the ring --------------------------------------------------------------------------------------
def _record(ring, seq, kind="allreduce"):
    """What Guard.run records for call number ``seq``."""
    rec = ring.records[seq % ring.size]
    rec.seq, rec.kind, rec.what, rec.state = seq, kind, None, flight.STARTED
    return rec


def test_ring_keeps_the_last_n_calls_oldest_first():
    ring = flight.Ring(3)
    assert ring.last() == []
    _record(ring, 0)
    assert [r.seq for r in ring.last()] == [0]
    records = {id(r) for r in ring.records}
    for seq in range(1, 8):
        _record(ring, seq)
    assert [r.seq for r in ring.last()] == [5, 6, 7]
    assert {id(r) for r in ring.records} == records  # preallocated: reused, never made anew


def test_recorder_size_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv(flight.ENV, "0")
    assert flight.ring_size() == 0 and flight.new_ring() is None
    assert not flight_recorder.install_signal()  # off: no handler either
    monkeypatch.setenv(flight.ENV, "5")
    assert flight.new_ring().size == 5
    monkeypatch.setenv(flight.ENV, "many")
    assert flight.ring_size() == flight.DEFAULT_SIZE
    assert "is not a number of calls" in capsys.readouterr().err
    monkeypatch.delenv(flight.ENV)
    assert flight.ring_size() == flight.DEFAULT_SIZE == 2000
    with pytest.raises(ValueError, match="at least one call"):
        flight.Ring(0)


def test_signal_handler_never_replaces_the_users():
    mine = signal.getsignal(signal.SIGUSR1)
    try:
        def handler(*_):
            pass
        signal.signal(signal.SIGUSR1, handler)
        assert not flight_recorder.install_signal()
        assert signal.getsignal(signal.SIGUSR1) is handler
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        assert flight_recorder.install_signal()
        assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, mine)


def test_a_dump_that_cannot_be_written_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert flight_recorder.dump(tmp_path / "file" / "x") is None
    assert "could not write its dump" in capsys.readouterr().err
    path = flight_recorder.dump(tmp_path / "d")
    data = json.loads(path.read_text())
    assert path.name == "rank-0.json" and data["format"] == flight_recorder.FORMAT
    assert data["pid"] == os.getpid() and data["reason"] == "request"


# -- the doctor on hand-written dumps --------------------------------------------------------------
def _rec(seq, kind="allreduce", state="finished", count=1024, end=100.0, error=None, name=None):
    return {"seq": seq, "kind": kind, "state": state, "error": error, "start": end - 0.1,
            "end": None if state == "started" else end, "name": name, "count": count,
            "dtype": "float32", "bytes": None if count is None else 4 * count, "op": "sum",
            "algorithm": "ring"}


def _dumps(per_rank, size=None, time=110.0):
    """``{rank: [records]}`` as dumps of one blocking communicator of COMM_WORLD."""
    size = len(per_rank) if size is None else size
    return {r: {"rank": r, "size": size, "time": time, "engines": [],
                "communicators": [{"id": f"blocking 0 of ranks 0-{size - 1}",
                                   "members": list(range(size)), "records": recs}]}
            for r, recs in per_rank.items()}


def _msg(seq, kind, side, peer, tag=7, state="finished", error=None, nbytes=32):
    return {"seq": seq, "kind": kind, "side": side, "peer": peer, "peer_in_comm": peer,
            "comm_size": 3, "tag": tag, "bytes": nbytes, "dtype": "float32", "state": state,
            "error": error, "start": 99.0, "end": None if state == "started" else 100.0}


def test_doctor_explains_point_to_point_messages_that_wait():
    """A receive that waits or timed out, with what its peer's dump says of the other half:
    nothing sent with that tag, a send that waits too, or no dump at all."""
    dumps = _dumps({0: [], 1: [], 2: []})
    dumps[0]["pt2pt"] = {"seq": 2, "records": [_msg(1, "send", "send", 1, tag=3),
                                                _msg(2, "isend", "send", 2, state="started")]}
    dumps[1]["pt2pt"] = {"seq": 1, "records": [
        _msg(1, "recv", "recv", 0, state="failed", error="TimeoutError")]}
    dumps[2]["pt2pt"] = {"seq": 1, "records": [_msg(1, "recv", "recv", 0, nbytes=64,
                                                    state="started")]}
    assert doctor.diagnose(dumps) == [
        "rank 0 waits in isend to rank 2 (tag 7, 32 B); rank 2 is in recv from rank 0 (tag 7, "
        "64 B) too (a size or dtype that differs?)",
        "rank 1 timed out in recv from rank 0 (tag 7, 32 B); rank 0 has sent it nothing with "
        "tag 7 in its last 2 point-to-point messages",
        "rank 2 waits in recv from rank 0 (tag 7, 64 B); rank 0 is in isend to rank 2 (tag 7, "
        "32 B) too (a size or dtype that differs?)"]
    del dumps[0]
    assert doctor.diagnose(dumps)[-1] == "rank 2 waits in recv from rank 0 (tag 7, 64 B); " \
        "rank 0 has no dump"


def test_doctor_finds_nothing_in_agreeing_dumps():
    assert doctor.diagnose(_dumps({r: [_rec(0), _rec(1)] for r in range(3)})) == []


def test_doctor_names_a_rank_still_in_an_earlier_call():
    dumps = _dumps({0: [_rec(57), _rec(58, state="started", name="grad.fc1", count=1 << 20)],
                    1: [_rec(57), _rec(58, state="started", name="grad.fc1", count=1 << 20)],
                    2: [_rec(57, state="started")],
                    3: [_rec(57), _rec(58, state="started", name="grad.fc1", count=1 << 20)]})
    assert doctor.diagnose(dumps) == [
        "ranks 0, 1, 3 wait in allreduce #58 (grad.fc1, 4 MiB); rank 2 is still in allreduce #57"]


def test_doctor_names_a_rank_in_compute_and_a_missing_dump():
    waiting = [_rec(57), _rec(58, state="failed", error="TimeoutError: allreduce #58 timed out")]
    dumps = _dumps({0: waiting, 1: waiting, 3: [_rec(57, end=98.0)]}, size=4)
    assert doctor.diagnose(dumps) == [
        "rank 2 has no dump",
        "ranks 0, 1 wait in allreduce #58 (4 KiB); rank 3 is in compute: its last call "
        "allreduce #57 finished 12.0 s before the others' dumps"]


def test_doctor_says_whom_the_waiting_ranks_wait_for():
    dumps = _dumps({0: [_rec(5, state="started")], 1: [_rec(5, state="started")],
                    2: [_rec(4)]}, time=101.5)
    dumps[0]["communicators"][0]["waiting_for"] = [1, 2]  # ring neighbours
    dumps[1]["communicators"][0]["waiting_for"] = [0]
    assert doctor.diagnose(dumps) == [
        "ranks 0, 1 wait in allreduce #5 (4 KiB) for rank 2; rank 2 is in compute: its last "
        "call allreduce #4 finished 1.5 s before the others' dumps"]


def test_doctor_names_unsubmitted_non_blocking_operations():
    def engine(submitted, outstanding):
        return [{"label": "MPI_COMM_WORLD (3 ranks)", "submitted": submitted,
                 "outstanding": outstanding}]
    op = {"kind": "iallreduce", "name": None, "seq": 4, "state": "submitted",
          "description": "iallreduce #4 (count 8, dtype float32, op sum, algorithm ring)"}
    named = dict(op, name="grad.fc1", seq=0)
    dumps = _dumps({0: [], 1: [], 2: []})
    dumps[0]["engines"] = engine(5, [op, named])
    dumps[1]["engines"] = engine(5, [op])
    dumps[2]["engines"] = engine(4, [named])
    assert doctor.diagnose(dumps) == [
        "ranks 0, 2 wait for the non-blocking operation 'grad.fc1' on MPI_COMM_WORLD (3 ranks), "
        "which rank 1 has not submitted",
        "rank 2 has not submitted iallreduce #4 (count 8, dtype float32, op sum, algorithm ring) "
        "on MPI_COMM_WORLD (3 ranks) (the others have)"]


def test_doctor_names_a_different_collective_and_a_count_mismatch():
    dumps = _dumps({0: [_rec(11), _rec(12, state="started")],
                    1: [_rec(11), _rec(12, kind="bcast", state="started")],
                    2: [_rec(11), _rec(12, state="started")]})
    assert doctor.diagnose(dumps) == ["rank 1 called bcast #12 where the others called "
                                      "allreduce #12"]
    error = "ValueError: allreduce: count or dtype differs across ranks"
    dumps = _dumps({0: [_rec(40, state="failed", error=error)],
                    1: [_rec(40, state="failed", error=error)],
                    2: [_rec(40, state="failed", error=error, count=1000)]})
    assert doctor.diagnose(dumps) == ["count mismatch at allreduce #40: 1024 on ranks 0, 1; "
                                      "1000 on rank 2"]


def test_doctor_reports_a_failure_and_dumps_of_different_jobs():
    error = "CollectiveError: allreduce #7 failed on rank 1: MemoryError"
    dumps = _dumps({0: [_rec(7, state="failed", error=error)],
                    1: [_rec(7, state="failed", error="MemoryError")]})
    assert doctor.diagnose(dumps) == [f"allreduce #7 (4 KiB) failed on ranks 0, 1: {error}"]
    dumps[2] = dict(dumps[0], rank=2, size=4)
    assert doctor.diagnose(dumps)[:2] == [
        "the dumps come from jobs of different sizes (2, 4 ranks): they are not one job's; keep "
        "each job's dumps in a folder of its own", "rank 3 has no dump"]


def test_doctor_exit_status(tmp_path, capsys):
    assert doctor.main([str(tmp_path)]) == 2 and "no dumps" in capsys.readouterr().err
    for rank, dump in _dumps({0: [_rec(0)], 1: [_rec(0)]}).items():
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(dump))
    assert doctor.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == "no problem found (2 of 2 ranks' dumps)\n"
    (tmp_path / "rank-1.json").unlink()
    out = subprocess.run([sys.executable, "-m", "collectives", "doctor", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (1, "rank 1 has no dump\n"), out.stderr


# -- real hangs on 3 ranks -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hangs(tmp_path_factory):
    """Run every scenario of tests/flight_hangs.py on 3 ranks; (dump directory, output)."""
    out = tmp_path_factory.mktemp("hangs")
    cmd = [*mpiexec(), "-n", "3", sys.executable, str(HERE / "flight_hangs.py"), str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        output, _ = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the hang scenarios hung (killed after {HANG_S} s): {output[-3000:]}")
    assert "done" in output, output[-3000:]  # every scenario before "crash" ran to its end
    return out, output


def _file(directory, rank):
    """``directory/<job id>/rank-<rank>.json``: the dump of one job, the only one there."""
    found = list(directory.glob(f"*/rank-{rank}.json"))
    assert len(found) == 1, found
    return found[0]


def _doctor(directory):
    assert len(doctor.jobs(directory)) == 1, sorted(doctor.jobs(directory))
    dumps = doctor.load(directory)
    assert sorted(dumps) == [0, 1, 2], f"a rank did not dump into {directory}"
    return dumps, doctor.diagnose(dumps)


def test_hang_a_rank_skips_a_collective(hangs):
    dumps, lines = _doctor(hangs[0] / "skip")
    assert len(lines) == 1, lines
    assert re.fullmatch(r"ranks 0, 1 wait in allreduce #(\d+) \(4 KiB\); rank 2 is in compute: "
                        r"its last call allreduce #(\d+) finished \d+\.\d s before the others' "
                        r"dumps", lines[0]), lines
    assert [dumps[r]["reason"] for r in range(3)] == ["timeout", "timeout", "signal"]


def test_hang_a_rank_calls_a_different_collective(hangs):
    dumps, lines = _doctor(hangs[0] / "different")
    assert len(lines) == 1, lines
    assert re.fullmatch(r"rank 1 called bcast #(\d+) where the others called allreduce #\1 "
                        r"\(communicator blocking \d of ranks 0-2\)", lines[0]), lines


def test_hang_count_mismatch_agrees_with_the_guard(hangs):
    dumps, lines = _doctor(hangs[0] / "count")
    assert len(lines) == 1, lines
    assert re.fullmatch(r"count mismatch at allreduce #\d+: 1024 on ranks 0, 1; 1000 on rank 2 "
                        r"\(communicator blocking \d of ranks 0-2\)", lines[0]), lines
    # the guard's own errors name the same counts (the ranks that saw the mismatch say theirs)
    said = dict(re.findall(r"rank (\d) has (\d+) elements of float32", hangs[1]))
    assert said and all({"2": "1000"}.get(r, "1024") == n for r, n in said.items()), hangs[1]


def test_hang_a_rank_stuck_in_compute(hangs):
    dumps, lines = _doctor(hangs[0] / "compute")
    assert len(lines) == 1, lines
    found = re.fullmatch(r"ranks 0, 1 wait in allreduce #(\d+) \(4 KiB\) \(communicator "
                         r"blocking \d of ranks 0-2\); rank 2 is in compute: its last call "
                         r"allreduce #(\d+) finished (\d+\.\d) s before the others' dumps",
                         lines[0])
    assert found and int(found[2]) == int(found[1]) - 1, lines
    assert float(found[3]) >= 0.9  # the others' timeout: 1 s after their call began
    assert dumps[2]["reason"] == "signal" and dumps[0]["reason"] == "timeout"
    comm = next(c for c in dumps[0]["communicators"] if c["role"] == "blocking")
    assert comm["active"] and comm["records"][-1]["state"] == "started"  # dumped as it timed out


def test_stall_warning_dumps_and_says_what_the_missing_rank_did_last(hangs):
    dumps, lines = _doctor(hangs[0] / "named")
    assert lines == ["ranks 0, 1 wait for the non-blocking operation 'grad.fc1' on a "
                     "communicator (3 ranks), which rank 2 has not submitted"], lines
    assert [dumps[r]["reason"] for r in range(3)] == ["stall", "stall", "request"]
    warning = re.search(r"stall warning: (.*)", hangs[1])[1]
    assert re.search(r"rank\(s\) 2 have not submitted it; what they did last \(flight recorder\): "
                     r"rank 2: its last call, iallreduce #\d+, finished \d+\.\d s ago", warning), \
        warning


def test_with_the_recorder_off_a_timeout_dumps_nothing(hangs):
    assert "off: timed out" in hangs[1]
    assert not (hangs[0] / "off").exists()


def test_an_unhandled_error_dumps(hangs):
    path = _file(hangs[0] / "crash", 1)
    data = json.loads(path.read_text())
    assert data["reason"] == "crash" and data["error"] == "RuntimeError: boom on rank 1"
    comm = next(c for c in data["communicators"] if c["role"] == "blocking")
    assert [r["state"] for r in comm["records"]] == ["finished"] * 3


# -- abort mode (Options.on_error="abort"): each scenario ends its job, so one job each ----------
def _abort_job(tmp_path, scenario, **env):
    cmd = [*mpiexec(), "-n", "3", sys.executable, str(HERE / "flight_hangs.py"), str(tmp_path),
           scenario]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=HANG_S, env=dict(os.environ, PYTHONUNBUFFERED="1", **env))
    assert out.returncode != 0, out.stdout[-3000:]  # MPI_Abort
    return tmp_path / scenario, out.stdout


def test_abort_mode_timeout_dumps_then_ends_the_job(tmp_path):
    """The watchdog of abort mode ends the job on a timeout (rank 2 skipped the call): the
    ranks that waited dump first (one of them at least: the first abort may come before the
    other's watchdog fires), their records show the call still started, and the doctor says
    that rank 2, which never made the call and was ended by the abort, has no dump."""
    where, output = _abort_job(tmp_path, "abort-timeout")
    assert re.search(r"allreduce #\d+ timed out after 1 s \(Options.timeout\).*ending the job",
                     output), output[-3000:]
    dumps = {int(p.stem.split("-")[1]): json.loads(p.read_text())
             for p in where.glob("*/rank-*.json")}
    assert dumps and set(dumps) <= {0, 1}, sorted(dumps)  # the first abort may beat the other
    for rank, data in dumps.items():
        assert data["reason"] == "timeout", (rank, data["reason"])
        comm = next(c for c in data["communicators"] if c["role"] == "blocking")
        assert [r["state"] for r in comm["records"]] == ["finished"] * 3 + ["started"]
    lines = doctor.diagnose(doctor.load(where))
    assert "rank 2 has no dump" in lines, lines


def test_abort_mode_error_dumps_then_ends_the_job(tmp_path):
    """An error in an abort-mode call (rank 1's bool array) dumps that rank's recorder, with
    the call failed and its error, then ends the job with one line. The error is a bad argument
    that the checks found before any message: it dumps only when asked
    (``COLLECTIVES_DUMP_ON_ARGUMENT_ERROR=1``; the default is tested in test_job_errors.py)."""
    where, output = _abort_job(tmp_path, "abort-error", COLLECTIVES_DUMP_ON_ARGUMENT_ERROR="1")
    assert re.search(r"collectives: rank 1: allreduce #\d+ failed on this rank: TypeError: .*"
                     r"ending the job", output), output[-3000:]
    data = json.loads(_file(where, 1).read_text())
    assert data["reason"] == "argument error" and data["error"].startswith("TypeError: "), \
        data["error"]
    comm = next(c for c in data["communicators"] if c["role"] == "blocking")
    assert [r["state"] for r in comm["records"]] == ["finished"] * 3 + ["failed"]


# -- dumps per job: two real jobs dump into one directory (issue 50, item 3) -----------------------
#: 2 ranks, ``count`` elements: rank 1 comes late to the second call, rank 0 times out there
#: (and dumps); rank 1 then meets its notice (and dumps): one job's dumps, both of that count.
#: "ring", whose second step rank 1 cannot finish without rank 0 (MPI's own allreduce, which
#: rank 0 posted before it gave up, can complete without it).
_LATE = """
import sys, time, numpy as np, collectives
from mpi4py import MPI
x = np.ones(int(sys.argv[1]), np.float32)
collectives.allreduce(x)  # every rank: the communicator set up, the job's id agreed
if MPI.COMM_WORLD.rank == 1:
    time.sleep(2.0)
try:
    collectives.allreduce(x, algorithm="ring", options=collectives.Options(timeout=1))
except TimeoutError:
    pass
"""


def test_the_doctor_never_mixes_two_jobs_dumps(tmp_path):
    """Two jobs of 2 ranks, of counts 1024 and 1000, dump into one COLLECTIVES_DUMP_DIR: each
    into a folder of its own, named by an id its ranks agreed on. The doctor explains the newest
    and names the other; ``--all`` explains each apart; neither reports the count mismatch that
    comparing one job's rank 0 with the other's rank 1 would (checked too: the jobs differ)."""
    script = tmp_path / "late.py"
    script.write_text(_LATE)
    dumps = tmp_path / "dumps"
    for count in (1024, 1000):
        out = subprocess.run([*mpiexec(), "-n", "2", sys.executable, str(script), str(count)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=HANG_S, env=dict(os.environ, PYTHONUNBUFFERED="1",
                                                      COLLECTIVES_DUMP_DIR=str(dumps)))
        assert out.returncode == 0, out.stdout[-3000:]
        assert out.stdout.count("flight recorder dumped") == 1, out.stdout  # said once
    jobs = doctor.jobs(dumps)
    assert len(jobs) == 2 and sorted(p.name for p in dumps.iterdir()) == sorted(jobs), jobs
    (old, first), (new, second) = jobs.items()  # oldest first
    for job, count in ((first, 1024), (second, 1000)):
        assert sorted(job) == [0, 1], job
        assert len({d["job"] for d in job.values()}) == 1
        assert {d["reason"] for d in job.values()} == {"timeout"}
        counts = {r["count"] for d in job.values() for c in d["communicators"]
                  for r in c["records"]}
        assert counts == {count}, counts
    mixed = doctor.diagnose({0: second[0], 1: first[1]})  # what a mixed folder showed before
    assert any(line.startswith("count mismatch") for line in mixed), mixed
    # the newest by default, with a word on the other
    run = subprocess.run([sys.executable, "-m", "collectives", "doctor", str(dumps)],
                         capture_output=True, text=True, timeout=60)
    lines = run.stdout.splitlines()
    assert run.returncode == 1 and lines[0].startswith(f"job {new}: the newest of 2 jobs' "
                                                       f"dumps in {dumps} (older: {old};"), lines
    assert lines[1:] == doctor.diagnose(second) and lines[1:], lines
    # every job apart
    run = subprocess.run([sys.executable, "-m", "collectives", "doctor", "--all", str(dumps)],
                         capture_output=True, text=True, timeout=60)
    assert run.stdout.splitlines() == [f"job {old}:", *("  " + x for x in doctor.diagnose(first)),
                                       f"job {new}:", *("  " + x for x in doctor.diagnose(second))]
    assert not any("mismatch" in x for x in run.stdout.splitlines()), run.stdout
    # a job's own folder: that job alone
    assert doctor.load(dumps / old) == first and doctor.load(dumps) == second
