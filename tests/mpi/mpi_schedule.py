"""Recorded message patterns (``collectives.tools.osu.schedule``) against each algorithm's definition.

One allreduce of 840 float32 (every block split even at p <= 8) per algorithm, recorded on every
rank and placed in steps; the checks are the algorithms' own descriptions (docs/algorithms.md): who
sends to whom in which step, how much, how many steps, and the bytes each rank sends (the beta
terms of the cost formulas). Rank 0 also draws each diagram.
"""

from collections import Counter

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives._runtime import trace
from collectives.observe import OBSERVERS
from collectives._runtime.ranks import real_rank
from collectives._runtime.shmem.team import Team
from collectives.tools.osu.schedule import COUNT, record

N = COUNT * 4  # bytes per rank


def _pof2(p):
    pof2 = 1
    while pof2 * 2 <= p:
        pof2 *= 2
    return pof2, p - pof2


def _pairs(messages):
    return {(m.src, m.dst) for m in messages}


def _steps(s):
    by = {}
    for m in s.messages:
        by.setdefault(m.step, []).append(m)
    return [by.get(t, []) for t in range(s.steps)]


def test_recorder_is_off_outside_a_recording():
    """A recording observes the points ``p2p`` and ``shm`` while it lasts, and replaces nothing."""
    plain = Team.__dict__["run"], Team.__dict__["run_compiled"]
    assert trace.ACTIVE is None
    assert OBSERVERS.p2p == () and OBSERVERS.shm == ()
    with trace.recording(MPI.COMM_WORLD) as events:
        assert trace.ACTIVE is not None
        assert OBSERVERS.p2p == (trace.ACTIVE.message,)
        assert OBSERVERS.shm == (trace.ACTIVE.window,)
        with pytest.raises(RuntimeError):
            with trace.recording(MPI.COMM_WORLD):
                pass
        assert (Team.__dict__["run"], Team.__dict__["run_compiled"]) == plain
    assert trace.ACTIVE is None
    assert OBSERVERS.p2p == () and OBSERVERS.shm == ()
    assert events == []
    collectives.allreduce(np.ones(4), algorithm="ring")
    assert events == []  # nothing recorded once the recording ended


def test_repeated_shm_calls_are_recorded_each_time():
    """A repeated call runs shm through its lane (``Team.run_compiled``): each pass through
    the window is an event, as the first call's (``Team.run``)."""
    comm = MPI.COMM_WORLD
    x = np.ones(8)
    y = np.empty_like(x)
    collectives.allreduce(x, out=y)
    with trace.recording(comm) as events:
        for _ in range(3):
            collectives.allreduce(x, out=y)
    kinds = [e.kind for e in events]
    assert kinds == ([] if comm.size == 1 else ["shm allreduce (replicated)"] * 3), kinds


def test_ring():
    p = MPI.COMM_WORLD.size
    s = record("ring", MPI.COMM_WORLD)
    if p == 1:  # the dispatcher returns before any algorithm
        assert s.messages == () and s.steps == 0
        return
    assert s.steps == 2 * (p - 1)
    for step in _steps(s):  # every rank sends one block to its right neighbour in every step
        assert sorted((m.src, m.dst) for m in step) == [(r, (r + 1) % p) for r in range(p)]
        assert all(m.nbytes == N // p for m in step)
    assert [s.sent(r) for r in range(p)] == [2 * N * (p - 1) // p] * p  # 2 n (p-1)/p


def test_recursive_doubling():
    p = MPI.COMM_WORLD.size
    s = record("recursive_doubling", MPI.COMM_WORLD)
    pof2, rem = _pof2(p)
    lg = pof2.bit_length() - 1
    assert s.steps == lg + (2 if rem else 0)
    assert all(m.nbytes == N for m in s.messages)  # the whole vector every time
    steps = _steps(s)
    if rem:  # the fold: even ranks below 2 rem hand in their vector, and get the result back
        fold_in, steps, fold_out = steps[0], steps[1:-1], steps[-1]
        assert _pairs(fold_in) == {(2 * i, 2 * i + 1) for i in range(rem)}
        assert _pairs(fold_out) == {(2 * i + 1, 2 * i) for i in range(rem)}
    for k, step in enumerate(steps):  # step k: new ranks swap with newrank ^ 2^k
        assert _pairs(step) == {(real_rank(q, rem), real_rank(q ^ (1 << k), rem))
                                for q in range(pof2)}
    for r in range(p):
        sits_out = r < 2 * rem and r % 2 == 0
        absorbs = r < 2 * rem and r % 2 == 1
        assert s.sent(r) == (N if sits_out else N * lg + (N if absorbs else 0))


def test_rabenseifner():
    p = MPI.COMM_WORLD.size
    s = record("rabenseifner", MPI.COMM_WORLD)
    pof2, rem = _pof2(p)
    lg = pof2.bit_length() - 1
    assert s.steps == 2 * lg + (2 if rem else 0)
    steps = _steps(s)
    if rem:
        assert _pairs(steps[0]) == {(2 * i, 2 * i + 1) for i in range(rem)}
        assert _pairs(steps[-1]) == {(2 * i + 1, 2 * i) for i in range(rem)}
        steps = steps[1:-1]
    for k, step in enumerate(steps):  # halving with mask pof2/2 .. 1, then doubling back
        j = k if k < lg else 2 * lg - 1 - k
        mask = pof2 >> (j + 1)
        assert _pairs(step) == {(real_rank(q, rem), real_rank(q ^ mask, rem)) for q in range(pof2)}
        assert {m.nbytes for m in step} == {N >> (j + 1)}  # n/2, n/4, ... and back
    for r in range(p):
        sits_out = r < 2 * rem and r % 2 == 0
        absorbs = r < 2 * rem and r % 2 == 1
        assert s.sent(r) == (N if sits_out else 2 * N * (pof2 - 1) // pof2 + (N if absorbs else 0))


def test_tree():
    p = MPI.COMM_WORLD.size
    s = record("tree", MPI.COMM_WORLD)
    if p == 1:
        assert s.messages == ()
        return
    lg = (p - 1).bit_length()  # ceil(lg p)
    assert s.steps == 2 * lg
    assert len(s.messages) == 2 * (p - 1) and all(m.nbytes == N for m in s.messages)
    parent = {r: r - (r & -r) for r in range(1, p)}  # vrank minus its lowest set bit (root 0)
    up = [m for m in s.messages if m.step < lg]
    down = [m for m in s.messages if m.step >= lg]
    assert sorted((m.src, m.dst) for m in up) == sorted(parent.items())  # reduce, then
    assert sorted((m.dst, m.src) for m in down) == sorted(parent.items())  # broadcast
    assert s.sent(0) == N * lg  # the root's link carries the vector lg p times down


def test_hierarchical():
    p = MPI.COMM_WORLD.size
    s = record("hierarchical", MPI.COMM_WORLD, options=collectives.Options(node_size=2))
    if p == 1:
        assert s.messages == () and s.windows == ()
        return
    nodes = [tuple(range(a, min(a + 2, p))) for a in range(0, p, 2)]
    m = min(len(n) for n in nodes)
    pairs = [n for n in nodes if len(n) == 2]
    # through the window in the node: reduce-scatter first, allgather last, no messages
    assert Counter((w.mode, w.ranks) for w in s.windows) == Counter(
        [("shm reduce-scatter", n) for n in pairs] + [("shm allgather", n) for n in pairs])
    first = {w.step for w in s.windows if w.mode == "shm reduce-scatter"}
    last = {w.step for w in s.windows if w.mode == "shm allgather"}
    assert first <= {0} and last <= {s.steps - 1}
    # across: a ring among the ranks holding each position, block n/m in N pieces
    big = len(nodes)
    for msg in s.messages:
        holders = list(range(msg.src % 2, p, 2))  # local rank src % 2 on every node
        assert msg.src % 2 < m
        assert msg.dst == holders[(holders.index(msg.src) + 1) % big]
        assert msg.nbytes == N // m // big
    for r in range(p):
        holder = r % 2 < m
        assert s.sent(r) == (2 * (big - 1) * (N // m // big) if holder and big > 1 else 0)


def test_diagrams_render(tmp_path):
    pytest.importorskip("matplotlib")
    from collectives.tools.osu.schedule import draw

    s = record("rabenseifner", MPI.COMM_WORLD)
    if MPI.COMM_WORLD.rank == 0:
        out = draw(s, tmp_path / "s.png")
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
