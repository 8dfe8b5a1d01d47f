"""The figures the docs show: the README's picture command, and the schedule diagrams' steps.

The recorded schedules themselves are checked against the algorithms at every world size in
tests/mpi/mpi_schedule.py; here the step placement runs on hand-written events, and the drawing
and the README's render command run without MPI ranks.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from collectives._runtime.trace import Event
from collectives.tools.osu.schedule import place, schedule

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
#: the README's picture: rendered from the committed results by exactly this command
README_JSON = "docs/results/headline_mpich_2.json"
README_RENDER = ["collectives-plot", README_JSON, "-o", "{out}"]


def _send(dest, n=8):
    return Event("p2p", dest=dest, sent=n)


def _recv(source, n=8):
    return Event("p2p", source=source, received=n)


def _swap(peer, n=8):
    return Event("p2p", dest=peer, sent=n, source=peer, received=n)


def _folded_doubling_p3():
    """Recursive doubling at p = 3 as the ranks record it: 0 folds into 1, 1 and 2 swap, 1
    returns the result to 0."""
    return [[_send(1), _recv(1)],
            [_recv(0), _swap(2), _send(0)],
            [_swap(1)]]


def test_fold_lines_up_the_exchange():
    """Rank 2 waits for nothing, yet its swap with rank 1 sits in rank 1's step, after the fold;
    rank 0's result arrives in the last step."""
    assert place(_folded_doubling_p3()) == [[0, 2], [0, 1, 2], [1]]


def test_a_rank_that_waits_for_nothing_starts_late_then_runs_early():
    # binomial reduce at p = 4, then broadcast: 3 -> 2, 1 -> 0, 2 -> 0; 0 -> 2, 0 -> 1, 2 -> 3
    events = [[_recv(1), _recv(2), _send(2), _send(1)],
              [_send(0), _recv(0)],
              [_recv(3), _send(0), _recv(0), _send(3)],
              [_send(2), _recv(2)]]
    assert place(events) == [[0, 1, 2, 3], [0, 3], [0, 1, 2, 3], [0, 3]]


def test_shared_memory_passes_are_taken_together():
    node = (0, 1)
    rs, ag = Event("shm reduce-scatter", group=node), Event("shm allgather", group=node)
    events = [[rs, _swap(2), ag], [rs, ag], [_swap(0)]]
    steps = place(events)
    assert steps == [[0, 1, 2], [0, 2], [1]]
    s = schedule("hierarchical", 16, events)
    assert [(w.step, w.mode, w.ranks) for w in s.windows] == [
        (0, "shm reduce-scatter", node), (2, "shm allgather", node)]
    assert s.steps == 3 and s.sent(0) == 8 and s.sent(1) == 0


@pytest.mark.parametrize("events, why", [
    ([[_send(1)], []], "sends"),                       # a send nobody receives
    ([[_recv(1), _send(1)], [_recv(0), _send(0)]], "cycle"),  # both wait first: a deadlock
])
def test_records_of_no_completed_call_are_refused(events, why):
    with pytest.raises(ValueError, match=why):
        place(events)


def test_schedule_diagram_renders(tmp_path):
    pytest.importorskip("matplotlib")
    from collectives.tools.osu.schedule import draw

    s = schedule("recursive_doubling", 8, _folded_doubling_p3())
    assert [(m.step, m.src, m.dst) for m in s.messages] == [(0, 0, 1), (1, 1, 2), (1, 2, 1),
                                                          (2, 1, 0)]
    out = draw(s, tmp_path / "rd.png")
    assert out.read_bytes()[:8] == PNG


def test_readme_picture_command_renders(tmp_path):
    """The README's render command, as the README gives it, on the committed JSON."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "allreduce_vs_mpi.png"
    exe = Path(sys.executable).with_name("collectives-plot")
    argv = [str(exe) if a == "collectives-plot" else a.format(out=out) for a in README_RENDER]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == PNG
    assert f"wrote {out}" in done.stdout
