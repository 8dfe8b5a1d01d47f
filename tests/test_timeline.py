"""The timeline's file format, merge, clock arithmetic, switch, picture and environment variable.

One process, except the last test: ``COLLECTIVES_TIMELINE`` under ``mpiexec -n 2``, where each
rank writes its file at exit and rank 0 merges them (the multi-rank recording itself:
tests/mpi/mpi_timeline.py).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

from collectives import observe
from collectives.diagnostics import timeline
from collectives._runtime.context import context
from collectives._runtime.guard import Guard
from collectives.tools.launch import mpiexec_command
from collectives.diagnostics.timeline import chrome, hooks
from collectives.diagnostics.timeline.__main__ import main as merge_main
from collectives.diagnostics.timeline.recorder import Recorder


def _meta(pid, tids=(1,)):
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "r"}}]
    out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": "t"}}
            for t in tids]
    return out


def _x(name, ts, dur, pid=0, tid=1):
    return {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid}


def test_check_accepts_nested_spans_and_names_each_broken_rule():
    good = [*_meta(0, (1, 2)), _x("call", 1.0, 10.0), _x("round", 2.0, 3.0),
            _x("round", 5.0, 6.0), _x("call", 11.0, 0.0), _x("engine", 0.5, 1.0, tid=2)]
    timeline.check({"traceEvents": good})
    broken = {
        "no 'ph'": [*_meta(0), {"name": "a", "ts": 0, "pid": 0, "tid": 1}],
        "no dur >= 0": [*_meta(0), _x("a", 0.0, -1.0)],
        "no dur": [*_meta(0), {"name": "a", "ph": "X", "ts": 0.0, "pid": 0, "tid": 1}],
        "no process_name": [_meta(0)[1], _x("a", 0.0, 1.0)],
        "no thread_name": [*_meta(0), _x("a", 0.0, 1.0, tid=3)],
        "before the span": [*_meta(0), _x("a", 5.0, 1.0), _x("b", 4.0, 0.5)],
        "without nesting": [*_meta(0), _x("a", 0.0, 10.0), _x("b", 5.0, 6.0)],
        "phase 'B'": [*_meta(0), {**_x("a", 0.0, 1.0), "ph": "B"}],
    }
    for problem, events in broken.items():
        with pytest.raises(ValueError, match=problem):
            timeline.check({"traceEvents": events})


def test_rank_events_align_clocks_sort_and_name_lanes():
    """ts = (t - offset - origin) in us, whole ns; outer spans first; messages named by what
    they waited for; NumPy values as JSON."""
    rec = Recorder()
    rec.add("message", "", 10.000003, 10.000004, (1, 2, None, 8))  # peers, then expected
    rec.add("call", "allreduce", 10.000001, 10.000005,
            ("grad.w", None, (np.dtype(np.float32), 16, "ring", None)), 7)
    # a call's span taken from its flight record carries the record's description
    rec.add("call", "allreduce", 10.000006, 10.000007,
            (None, 4, np.dtype(np.float32), "sum", "auto: ring"), 8)
    rec.add("reduce", "reduce", 10.000003, 10.000003, ("sum", np.int64(16)))
    events = chrome.rank_events(rec, rank=3, offset=2.0, origin=8.0)
    meta = {e["name"]: e for e in events if e["ph"] == "M"}
    assert meta["process_name"]["args"]["name"] == "rank 3"
    assert meta["thread_name"]["args"]["name"] == "caller (main thread)"
    spans = [e for e in events if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in spans] == [
        ("allreduce", 1.0, 4.0), ("sendrecv", 3.0, 1.0), ("reduce", 3.0, 0.0),
        ("allreduce", 6.0, 1.0)]
    assert spans[0]["args"] == {"name": "grad.w", "count": 4, "dtype": "float32", "bytes": 16,
                                "algorithm": "ring", "seq": 7}
    assert spans[1]["args"] == {"to": [1], "from": [2], "bytes_received": 8}
    assert spans[3]["args"] == {"count": 4, "dtype": "float32", "bytes": 16,
                                "algorithm": "auto: ring", "seq": 8}
    json.dumps(events)  # every value is JSON
    timeline.check(chrome.document(events, [{"rank": 3}]))


def test_merge_orders_ranks_rejects_duplicates_and_the_cli_writes(tmp_path):
    docs = {r: chrome.document([*_meta(r), _x("call", 1.0 + r, 1.0, pid=r)], [{"rank": r}])
            for r in (1, 0)}
    for r, doc in docs.items():
        chrome.write(doc, tmp_path / f"run.rank{r}.json")
    merged = chrome.merge(docs.values())
    assert [e["pid"] for e in merged["traceEvents"]] == [0, 0, 0, 1, 1, 1]
    assert [r["rank"] for r in merged["otherData"]["ranks"]] == [0, 1]
    with pytest.raises(ValueError, match="rank 0 appears in two"):
        chrome.merge([docs[0], docs[0]])
    files = [str(tmp_path / f"run.rank{r}.json") for r in (0, 1)]
    assert merge_main(["merge", *files, "-o", str(tmp_path / "run.json")]) == 0
    assert chrome.read(tmp_path / "run.json") == merged
    (tmp_path / "bad.json").write_text('{"traceEvents": []}')
    assert merge_main(["merge", str(tmp_path / "bad.json"), "-o", str(tmp_path / "x.json")]) == 1
    assert timeline.rank_path("out/run.json", 3) == os.path.join("out", "run.rank3.json")


def _library_attributes():
    """Every attribute of the classes and modules that the timeline observes, as they are."""
    from collectives import ops
    from collectives.engine import nonblocking
    from collectives._runtime import guard, p2p
    from collectives._runtime.shmem import team
    from collectives.compressed import coding
    from collectives.engine import requests

    owners = [Guard, team.Team, coding.TensorCoding, requests.Request, ops.Op, nonblocking,
              requests, guard, p2p, team]
    return {(repr(owner), name): value for owner in owners for name, value in vars(owner).items()}


def test_start_stop_registers_and_unregisters_every_observer(tmp_path):
    """Off, no point has the timeline's observers (nothing to pay but a test); on, each of
    them is registered on its point; stop() unregisters them and writes the file (one process:
    no messages). No attribute of the library changes meanwhile: observers, not wrappers."""
    before = _library_attributes()
    timed = set(hooks.OBSERVERS)
    assert timed == set(observe.POINTS) - {"p2p", "timeline_option", "dump"}
    for point, observer in hooks.OBSERVERS.items():
        assert observer not in getattr(observe.OBSERVERS, point)
    path = tmp_path / "one.json"
    timeline.start(path)
    with pytest.raises(RuntimeError, match="already recording"):
        timeline.start(path)
    for point, observer in hooks.OBSERVERS.items():
        assert getattr(observe.OBSERVERS, point).count(observer) == 1, point
    with timeline.span("phase", step=1):
        guard = context(MPI.COMM_SELF).guard
        guard.run("allreduce", lambda: None)
        guard.complete([], [], [])
    assert _library_attributes() == before
    assert timeline.stop() == str(path)
    for point, observer in hooks.OBSERVERS.items():
        assert observer not in getattr(observe.OBSERVERS, point), point
    assert _library_attributes() == before
    with pytest.raises(RuntimeError, match="no timeline"):
        timeline.stop()
    doc = chrome.read(path)
    timeline.check(doc)
    spans = [(e["cat"], e["name"]) for e in doc["traceEvents"] if e["ph"] == "X"]
    assert spans == [("user", "phase"), ("call", "allreduce"), ("message", "recv")] or \
        spans == [("user", "phase"), ("call", "allreduce"), ("message", "send")]
    with pytest.raises(ValueError, match="file name"):
        timeline.start("")


def test_plot_draws_a_png_and_the_cli_checks_its_window(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from collectives.tools.osu.plot import main as plot_main

    doc = chrome.document([*_meta(0, (1, 2)), *_meta(1), _x("call", 0.0, 500.0),
                           {**_x("round", 10.0, 100.0), "cat": "message"},
                           _x("engine", 0.0, 300.0, tid=2), _x("call", 20.0, 400.0, pid=1)],
                          [{"rank": 0}, {"rank": 1}])
    chrome.write(doc, tmp_path / "run.json")
    plot_main(["--timeline", str(tmp_path / "run.json"), "-o", str(tmp_path / "run.png")])
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for window, error in (("5:1", "END must be above START"),
                          ("600:700", "no spans in that window")):
        with pytest.raises(SystemExit) as exit_:
            plot_main(["--timeline", str(tmp_path / "run.json"), "--window", window])
        assert exit_.value.code == 2
        assert error in capsys.readouterr().err


def test_environment_variable_records_every_rank_and_merges_at_exit(tmp_path):
    """COLLECTIVES_TIMELINE under mpiexec -n 2: no call to start or stop; at exit each rank
    writes its file and rank 0 merges them into the named file (the rank files removed)."""
    code = ("import numpy as np, collectives\n"
            "x = np.ones(1000, dtype=np.float32)\n"
            "collectives.allreduce(x, out=x, algorithm='ring')\n"
            "collectives.iallreduce(x, name='w').wait()\n")
    path = tmp_path / "env.json"
    env = {**os.environ, timeline.ENV: str(path)}
    run = subprocess.run([*mpiexec_command(), "-n", "2", sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert sorted(os.listdir(tmp_path)) == ["env.json"]
    doc = chrome.read(path)
    timeline.check(doc)
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    for r in (0, 1):
        assert any(e["pid"] == r and e["cat"] == "call" and e["args"].get("algorithm") == "ring"
                   for e in spans)
        assert any(e["pid"] == r and e["cat"] == "request" and e["args"].get("name") == "w"
                   for e in spans)
