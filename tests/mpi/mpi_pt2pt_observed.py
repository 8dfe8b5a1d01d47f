"""Point-to-point messages in the flight recorder, the doctor's report and the timeline.

A receive whose sender never sends, under a short ``Options.timeout``: its record names the
peer (a rank of ``COMM_WORLD``, also on a split communicator), the tag, the bytes and the state,
the timeout dumps, and the doctor explains it from both ranks' dumps; a receive still in flight
shows as waiting. A small program of send, recv, sendrecv, isend and irecv leaves its messages
as spans of the merged timeline.
"""

import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.diagnostics import doctor, flight_recorder, timeline

# what is recorded does not depend on the world size: a pair, and a pair beside a third rank
# (docs/testing.md)
pytestmark = [pytest.mark.world_sizes(2, 3), pytest.mark.mpi(min_size=2)]

QUICK = collectives.Options(timeout=0.2)


def _shared_dir(comm):
    return Path(comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0))


def _last(kind):
    return [r for r in flight_recorder.P2P.snapshot(0.0)["records"] if r["kind"] == kind][-1]


def test_a_receive_that_times_out_is_recorded_dumped_and_explained(monkeypatch):
    world = MPI.COMM_WORLD
    where = _shared_dir(world)
    monkeypatch.setenv(flight_recorder.DIR_ENV, str(where))
    monkeypatch.setattr(flight_recorder, "_last_auto", [float("-inf")])  # not quiet yet
    # ranks 0 and 1 of COMM_WORLD as ranks 1 and 0 of a split communicator
    comm = world.Split(0 if world.rank < 2 else 1, key=-world.rank)
    try:
        if world.rank == 1:
            with pytest.raises(TimeoutError, match="recv from rank 1 .tag 77"):
                collectives.recv(np.empty(4), 1, tag=77, comm=comm, options=QUICK)
            rec = _last("recv")
            assert (rec["side"], rec["peer"], rec["peer_in_comm"], rec["tag"], rec["bytes"],
                    rec["dtype"], rec["state"], rec["error"]) == \
                ("recv", 0, 1, 77, 32, "float64", "failed", "TimeoutError")
            assert rec["start"] <= rec["end"]
        elif world.rank == 0:  # sends on another tag, and finishes
            collectives.send(np.ones(2, np.float32), 0, tag=5, comm=comm)
            rec = _last("send")
            assert (rec["peer"], rec["tag"], rec["state"]) == (1, 5, "finished")
        if world.rank == 1:
            collectives.recv(np.empty(2, np.float32), 1, tag=5, comm=comm)
        world.Barrier()
        if world.rank == 0:  # the sender's dump, as SIGUSR1 would make it
            flight_recorder.dump()
        world.Barrier()
        if world.rank == 1:  # dumped by the timeout
            dumps = doctor.load(where)
            assert set(dumps) == {0, 1}
            lines = doctor.diagnose(dumps)
            assert any(line.startswith("rank 1 timed out in recv from rank 0 (tag 77, 32 B); "
                                       "rank 0 has sent it nothing with tag 77 in its last")
                       for line in lines), lines
        world.Barrier()
        # a receive still in flight shows as waiting
        if world.rank < 2:
            req = collectives.irecv(np.empty(3, np.int32), 1 - comm.rank, tag=9, comm=comm)
            assert _last("irecv")["state"] == "started"
            snap = flight_recorder.snapshot()
            lines = doctor.diagnose({world.rank: snap})
            assert any(line.startswith(f"rank {world.rank} waits in irecv from rank "
                                       f"{1 - world.rank} (tag 9, 12 B)") for line in lines), lines
            collectives.send(np.arange(3, dtype=np.int32), 1 - comm.rank, tag=9, comm=comm)
            assert np.array_equal(req.wait(), np.arange(3))
            assert _last("irecv")["state"] == "finished"
    finally:
        comm.Free()
        world.Barrier()


def test_the_timeline_shows_the_messages():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    path = _shared_dir(comm) / "p2p.json"
    timeline.start(path)
    x = np.arange(8, dtype=np.float32)
    y = np.empty_like(x)
    collectives.sendrecv(x, right, y, left, sendtag=1, recvtag=1)
    req = collectives.irecv(y, left, tag=2)
    collectives.isend(x, right, tag=2).wait()
    req.wait()
    if r == 0:
        collectives.send(x, 1, tag=3)
    elif r == 1:
        collectives.recv(y, 0, tag=3)
    written = timeline.stop()
    try:
        if r != 0:
            assert written is None
            return
        doc = timeline.chrome.read(path)
        timeline.check(doc)
        for q in range(p):
            spans = [(e["name"], e["args"]["side"], e["args"]["peer"], e["args"]["tag"])
                     for e in doc["traceEvents"]
                     if e["ph"] == "X" and e["cat"] == "pt2pt" and e["pid"] == q]
            mine = {("sendrecv", "send", (q + 1) % p, 1), ("sendrecv", "recv", (q - 1) % p, 1),
                    ("irecv", "recv", (q - 1) % p, 2), ("isend", "send", (q + 1) % p, 2)}
            mine |= {("send", "send", 1, 3)} if q == 0 else \
                ({("recv", "recv", 0, 3)} if q == 1 else set())
            assert sorted(spans) == sorted(mine), (q, spans)
            assert all(e["args"]["bytes"] == 32 and e["args"]["dtype"] == "float32"
                       for e in doc["traceEvents"] if e.get("cat") == "pt2pt")
    finally:
        comm.Barrier()
