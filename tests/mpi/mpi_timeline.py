"""The timeline under real multi-rank runs: a few calls of every kind, then the merged file.

One recording per world size (blocking calls of two algorithms and a repeated one, non-blocking
ones through the engine, named ones, a compressed one), merged by rank 0 at ``stop()``; the file is checked
against the trace-event rules (:func:`collectives.timeline.check`: ph/ts/pid/tid, ``dur >= 0``,
named processes and lanes, monotone starts and proper nesting per lane) and for what the calls
must have left: one process per rank, the caller's and the engines' lanes, the arguments of each
call, the request names, exchange rounds inside the calls that send messages, the codec's spans.
``DistributedOptimizer``'s bucket names in a timeline: tests/mpi/mpi_torch.py, where PyTorch is
imported already.
"""

import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.diagnostics import timeline
from collectives._runtime.guard import Guard

# What the timeline records does not depend on the world size beyond one rank, two and an odd
# number (docs/testing.md)
pytestmark = pytest.mark.world_sizes(1, 2, 3)

RING = collectives.Options(segment_bytes=1024)  # ring in segments (4 KB arrays)


def _shared_dir(comm):
    return Path(comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0))


def test_merged_timeline_of_every_kind_of_call():
    comm = MPI.COMM_WORLD
    p = comm.size
    path = _shared_dir(comm) / "run.json"
    plain_run = Guard.__dict__["run"]
    timeline.start(path)
    assert timeline.active() == str(path)
    x = np.arange(1000, dtype=np.float32) + comm.rank
    ring = collectives.allreduce(x, algorithm="ring", options=RING)
    y = x.copy()
    for _ in range(3):  # the later ones repeat the first: the remembered fast path
        collectives.allreduce(x, out=y)
    reqs = [collectives.iallreduce(x, algorithm="ring", options=RING),
            collectives.iallreduce(x, name="layer0.weight"),
            collectives.ibcast(np.ones(10), name="layer1.bias")]
    collectives.waitall(reqs)
    comp = collectives.compressed_allreduce(x, "topk:ratio=0.1")
    written = timeline.stop()
    assert Guard.__dict__["run"] is plain_run  # off again: the library's own code
    assert timeline.active() is None
    assert np.array_equal(ring, np.sum([np.arange(1000, dtype=np.float32) + r for r in range(p)],
                                       axis=0, dtype=np.float32))
    assert comp.shape == x.shape
    if comm.rank != 0:
        assert written is None
        comm.Barrier()
        return
    try:
        assert written == str(path)
        doc = timeline.chrome.read(path)
        timeline.check(doc)
        events = doc["traceEvents"]
        spans = [e for e in events if e["ph"] == "X"]
        assert {e["pid"] for e in events} == set(range(p))
        assert [r["rank"] for r in doc["otherData"]["ranks"]] == list(range(p))
        lanes = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
        for r in range(p):
            assert (r, "caller (main thread)") in lanes
            if p > 1:  # one process runs non-blocking calls at once, on the caller's thread
                assert any(n.startswith("collectives-engine") for q, n in lanes if q == r)
                assert any(n.startswith("collectives-named") for q, n in lanes if q == r)
            mine = [e for e in spans if e["pid"] == r]
            calls = [e for e in mine if e["cat"] == "call"]
            if p > 1:  # one process runs no guarded call (nothing to send)
                ring_call = next(e for e in calls if e["name"] == "allreduce"
                                 and e["args"].get("algorithm") == "ring")
                assert ring_call["args"]["bytes"] == x.nbytes
                assert ring_call["args"]["dtype"] == "float32"
                assert sum(e["name"] == "allreduce" for e in calls) == 4
                auto_calls = [e for e in calls if e["name"] == "allreduce"
                              and e["args"].get("algorithm") != "ring"]
                for c in auto_calls:  # the repeats too: a lane's pass through the window
                    assert any(e["cat"] == "shm" and e["tid"] == c["tid"]
                               and c["ts"] <= e["ts"] <= c["ts"] + c["dur"] for e in mine), c
                rounds = [e for e in mine if e["cat"] == "message" and e["tid"] == 1
                          and ring_call["ts"] <= e["ts"] <= ring_call["ts"] + ring_call["dur"]]
                assert len(rounds) >= 2 * (p - 1)  # reduce-scatter and allgather, in segments
                comp_call = next(e for e in calls if e["name"] == "compressed_allreduce")
                assert comp_call["args"]["codec"] == "topk"
                assert any(e["cat"] == "encode" for e in mine)
                assert {"submit", "request"} <= {e["cat"] for e in mine}
            names = {e["args"]["name"] for e in mine
                     if e["cat"] == "request" and "name" in e.get("args", {})}
            assert {"layer0.weight", "layer1.bias"} <= names
    finally:
        comm.Barrier()


def test_abort_mode_calls_are_spans_too():
    """Options.on_error="abort" runs calls through its own runner (_runtime/abort_mode.py): they are
    call spans of the timeline as well."""
    comm = MPI.COMM_WORLD
    path = _shared_dir(comm) / "abort.json"
    timeline.start(path)
    x = np.ones(10, np.float32)
    collectives.allreduce(x, algorithm="ring", options=collectives.Options(on_error="abort"))
    written = timeline.stop()
    if comm.rank == 0 and comm.size > 1:
        events = timeline.chrome.read(written)["traceEvents"]
        calls = [e for e in events if e.get("ph") == "X" and e["name"] == "allreduce"]
        assert {e["pid"] for e in calls} == set(range(comm.size)), calls
    comm.Barrier()


def test_options_timeline_starts_a_recording_over_the_calls_communicator():
    """``Options(timeline=path)``: the first call made with it starts the recording, over that
    call's communicator (here every other rank's half of the world: its ranks are the
    timeline's processes); later calls with it record into it; after ``stop()`` the same file
    is not started again; a call on another communicator with the file of a recording in
    progress records into it without a second start."""
    world = MPI.COMM_WORLD
    half = world.Split(color=world.rank % 2, key=world.rank)
    path = _shared_dir(world) / f"option{world.rank % 2}.json"
    opts = collectives.Options(timeline=path)
    assert opts.timeline == str(path)
    with pytest.raises(ValueError, match="timeline must be a file name"):
        collectives.Options(timeline="")
    assert timeline.active() is None
    x = np.arange(100, dtype=np.float64) + world.rank
    first = collectives.allreduce(x, algorithm="ring", options=opts, comm=half)
    assert timeline.active() == str(path)
    second = collectives.allreduce(x, options=opts, comm=half)
    collectives.allreduce(x, algorithm="ring", options=opts)  # on the world: no second start
    assert np.array_equal(first, second)
    written = timeline.stop()
    collectives.allreduce(x, options=opts, comm=half)  # stopped: the file is not started again
    assert timeline.active() is None
    try:
        if half.rank != 0:
            assert written is None
            return
        assert written == str(path)
        doc = timeline.chrome.read(path)
        timeline.check(doc)
        assert [r["rank"] for r in doc["otherData"]["ranks"]] == list(range(half.size))
        calls = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["cat"] == "call"]
        if half.size > 1:  # one process runs no guarded call (nothing to send)
            assert {e["pid"] for e in calls} == set(range(half.size))
            for r in range(half.size):  # two calls on the half, one on the world, none after
                mine = [e for e in calls if e["pid"] == r and e["name"] == "allreduce"]
                assert len(mine) == 3 if world.size > 1 else 2, [(e["args"], e["ts"]) for e in mine]
    finally:
        half.Free()
        world.Barrier()
