"""Pipeline schedules as data (collectives.parallel.pipeline): the properties every schedule
must have, each schedule's bubble and memory on paper, and the layer partitioner."""

import itertools

import pytest

from collectives.parallel.pipeline import (BACKWARD, FORWARD, RECV_ACT, RECV_GRAD, SCHEDULES,
                                           SEND_ACT, SEND_GRAD, Action, balanced, build, check,
                                           check_sizes, given, ideal_bubble, peak_held, simulate)

STAGES = range(1, 6)
MICROBATCHES = range(1, 17)


def _all(name, stages, microbatches):
    return [SCHEDULES[name](s, stages, microbatches) for s in range(stages)]


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("stages", STAGES)
def test_every_schedule_is_runnable(name, stages):
    """Forward before backward of every micro-batch on every stage, each once; every receive
    posted before the compute that needs it; sends matched by the neighbor's receives in the
    same order; no deadlock (check raises otherwise); M = 1 to 16."""
    for microbatches in MICROBATCHES:
        _runnable(name, stages, microbatches)


def _runnable(name, stages, microbatches):
    schedule = _all(name, stages, microbatches)
    check(schedule, microbatches)
    for s, actions in enumerate(schedule):
        for m in range(microbatches):
            assert actions.index(Action(FORWARD, m)) < actions.index(Action(BACKWARD, m))
    for s in range(stages - 1):  # explicitly: the same order on both sides
        assert [a.microbatch for a in schedule[s] if a.kind == SEND_ACT] == \
            [a.microbatch for a in schedule[s + 1] if a.kind == RECV_ACT] == list(range(microbatches))
        assert [a.microbatch for a in schedule[s + 1] if a.kind == SEND_GRAD] == \
            [a.microbatch for a in schedule[s] if a.kind == RECV_GRAD]


@pytest.mark.parametrize("stages", STAGES)
def test_micro_batches_held(stages):
    """GPipe holds all M micro-batches on every stage; 1F1B at most S (stage s: min(S-s, M))."""
    for microbatches in MICROBATCHES:
        _held(stages, microbatches)


def _held(stages, microbatches):
    for s, actions in enumerate(_all("gpipe", stages, microbatches)):
        assert peak_held(actions) == microbatches
    for s, actions in enumerate(_all("1f1b", stages, microbatches)):
        assert peak_held(actions) == min(stages - s, microbatches) <= stages


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("stages", STAGES)
@pytest.mark.parametrize("f,b", [(1.0, 1.0), (1.0, 2.0)])
def test_bubble_on_paper_is_the_formula(name, stages, f, b):
    """With equal times on every stage, every stage idles (S-1)/(M+S-1) of the step."""
    for microbatches in MICROBATCHES:
        _bubble(name, stages, microbatches, f, b)


def _bubble(name, stages, microbatches, f, b):
    sim = simulate(_all(name, stages, microbatches), f, b)
    assert sim["busy"] == [microbatches * (f + b)] * stages
    assert sim["makespan"] == pytest.approx((microbatches + stages - 1) * (f + b))
    for bubble in sim["bubble"]:
        assert bubble == pytest.approx(ideal_bubble(stages, microbatches))


def test_check_finds_broken_schedules():
    """The checks can fail: a backward before its forward, a receive out of order, a deadlock."""
    good = _all("1f1b", 3, 4)
    check(good, 4)
    swapped = [list(a) for a in good]
    i, j = swapped[1].index(Action(FORWARD, 2)), swapped[1].index(Action(BACKWARD, 2))
    swapped[1][i], swapped[1][j] = swapped[1][j], swapped[1][i]
    with pytest.raises(ValueError, match="before its forward"):
        check(swapped, 4)
    reordered = [list(a) for a in good]
    recvs = [k for k, a in enumerate(reordered[1]) if a.kind == RECV_ACT]
    reordered[1][recvs[0]], reordered[1][recvs[1]] = reordered[1][recvs[1]], reordered[1][recvs[0]]
    with pytest.raises(ValueError, match="must match, in order"):
        check(reordered, 4)
    # stage 0 waits for the gradient of micro-batch 0 before it forwards micro-batch 1, but
    # stage 1 needs micro-batch 1's activation before it sends that gradient: a deadlock
    from collectives.parallel.pipeline.actions import with_messages
    order0 = [(FORWARD, 0), (BACKWARD, 0), (FORWARD, 1), (BACKWARD, 1)]
    order1 = [(FORWARD, 0), (FORWARD, 1), (BACKWARD, 0), (BACKWARD, 1)]
    with pytest.raises(ValueError, match="deadlocks"):
        check([with_messages(order0, 0, 2), with_messages(order1, 1, 2)], 2)
    missing = [list(a) for a in good]
    missing[0] = [a for a in missing[0] if a != Action(BACKWARD, 3)]
    with pytest.raises(ValueError, match="once"):
        check(missing, 4)


def test_receives_are_posted_one_compute_ahead():
    """A receive is posted before the compute action ahead of the one that needs it, so it
    travels while that one runs."""
    actions = SCHEDULES["gpipe"](1, 3, 3)
    assert [str(a) for a in actions[:4]] == ["RECV_ACT 0", "RECV_ACT 1", "FORWARD 0", "SEND_ACT 0"]
    assert actions.index(Action(RECV_GRAD, 0)) < actions.index(Action(FORWARD, 2))


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="at least as many micro-batches as stages"):
        build("gpipe", 4, 3)
    with pytest.raises(ValueError, match="the schedules are gpipe, 1f1b"):
        check_sizes("interleaved", 2, 4)
    with pytest.raises(ValueError, match="positive integer"):
        build("1f1b", 0, 4)
    assert len(build("1f1b", 4, 4)) == 4


def _brute(costs, stages):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        b = (0, *cuts, n)
        worst = max(sum(costs[b[i]:b[i + 1]]) for i in range(stages))
        best = worst if best is None else min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_balanced_split_is_optimal(seed):
    """The largest stage's cost is the smallest of every consecutive split (brute force)."""
    import random
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    costs = [rng.randint(0, 20) for _ in range(n)]
    for stages in range(1, n + 1):
        b = balanced(costs, stages)
        assert b[0] == 0 and b[-1] == n and len(b) == stages + 1
        assert all(x < y for x, y in zip(b, b[1:]))
        assert max(sum(costs[b[i]:b[i + 1]]) for i in range(stages)) == _brute(costs, stages)


def test_balanced_split_of_the_deep_model():
    """--model deep on digits: the small first and last layers do not get a stage each."""
    costs = [64 * 1024 + 1024] + [1024 * 1024 + 1024] * 15 + [1024 * 10 + 10]
    assert balanced(costs, 4) == (0, 4, 8, 12, 17)
    assert balanced(costs, 3) == (0, 6, 11, 17)


def test_split_errors():
    with pytest.raises(ValueError, match="cannot cut 3 layers into 4 pipeline stages"):
        balanced([1, 1, 1], 4)
    with pytest.raises(ValueError, match="holds 5 layers, the model has 6"):
        given([2, 3], 6)
    with pytest.raises(ValueError, match="at least one layer per stage"):
        given([2, 0, 4], 6)
    assert given([2, 4], 6) == (0, 2, 6)
