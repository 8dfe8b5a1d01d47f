"""The sharding plan, stage 3's gather schedule and the memory ledger, without MPI
(``collectives.parallel``)."""

import gc

import numpy as np
import pytest

from collectives.parallel import (BACKWARD, FORWARD, STAGES, MemoryLedger, ShardPlan,
                                  keep_for, live_peak, schedule)


@pytest.mark.parametrize("layers", [(235,), (195, 4, 20), (1, 0, 3), (0,), (7, 7, 7, 7)])
@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_plan_splits_every_range_into_the_owners_pieces(layers, world):
    """The even split (the first n % p shards one longer, as the ring's blocks), and every
    range, a layer or a bucket, cut at the shards' boundaries: the pieces, in rank order, are
    the range; each rank's piece sits at ``start`` in its shard and ``offset`` in the range."""
    plan = ShardPlan(layers, world)
    n = sum(layers)
    assert plan.total == n and sum(plan.counts) == n and max(plan.counts) - min(plan.counts) <= 1
    assert list(plan.counts) == sorted(plan.counts, reverse=True)
    x = np.arange(n)
    shards = [x[plan.shard(r)] for r in range(world)]
    assert np.array_equal(np.concatenate(shards), x)
    ranges = [(plan.layer(i).start, plan.layer(i).stop) for i in range(len(layers))]
    ranges += [(0, n), (n // 3, n // 3 + 1), (n, n)] + plan.buckets(0, n, 3)
    for lo, hi in ranges:
        if hi > n:
            continue
        parts = []
        for r in range(world):
            piece = plan.split(lo, hi, r)
            assert sum(piece.counts) == hi - lo
            mine = shards[r][piece.mine]
            assert np.array_equal(mine, x[lo:hi][piece.local])
            parts.append(mine)
        assert np.array_equal(np.concatenate(parts), x[lo:hi])


def test_plan_takes_counts_and_refuses_bad_ones():
    plan = ShardPlan((10,), 3, counts=(0, 10, 0))
    assert plan.shard(1) == slice(0, 10) and plan.split(2, 5, 0).counts == (0, 3, 0)
    for bad in [dict(layers=(-1,), world=2), dict(layers=(4,), world=0),
                dict(layers=(4,), world=2, counts=(1, 2)), dict(layers=(4,), world=2,
                                                               counts=(5, -1))]:
        with pytest.raises(ValueError):
            ShardPlan(**bad)
    with pytest.raises(ValueError, match="not inside"):
        ShardPlan((4,), 2).split(2, 5, 0)


def test_stages_table_and_schedule():
    """Stage 1 keeps the full gradient, 3 no full parameters; a step gathers forward 0..L-1
    and backward L-1-keep..1 (the last ``keep`` layers' forward gathers serve their backward;
    keep in 1..L-1)."""
    assert sorted(STAGES) == [1, 2, 3]
    assert [STAGES[s].full_grads for s in (1, 2, 3)] == [True, False, False]
    assert [STAGES[s].full_params for s in (1, 2, 3)] == [True, True, False]
    assert schedule(4) == [(0, FORWARD), (1, FORWARD), (2, FORWARD), (3, FORWARD),
                           (2, BACKWARD), (1, BACKWARD)]
    assert schedule(2) == [(0, FORWARD), (1, FORWARD)]
    assert schedule(4, keep=2) == [(0, FORWARD), (1, FORWARD), (2, FORWARD), (3, FORWARD),
                                   (1, BACKWARD)]
    assert schedule(4, keep=3) == schedule(4)[:4] and schedule(1) == [(0, FORWARD)]
    for layers, keep in [(4, 0), (4, 4), (3, 3)]:
        with pytest.raises(ValueError, match="keep"):
            schedule(layers, keep)


def test_kept_layers_add_no_memory():
    """``keep_for`` keeps the most trailing layers whose forward gathers can serve their
    backward without more gathered parameters alive at once than keeping the last one alone
    (``live_peak``, checked here against a walk of the schedule written out by hand)."""
    # the driver's wide model (64 -> 4096 -> 4096 -> 10): the middle layer is 98 % of it
    wide = [64 * 4096 + 4096, 4096 * 4096 + 4096, 4096 * 10 + 10]
    # keep 1: F0 holds layer 0 with layer 1 arriving, F1 layer 1 with 2, F2 layer 2 (kept)
    # with B1 arriving, B1 layer 1
    assert live_peak(wide, 1) == max(wide[0] + wide[1], wide[1] + wide[2], wide[1])
    # keep 2: nothing gathered in backward; F2 holds the kept layers 1 and 2
    assert live_peak(wide, 2) == max(wide[0] + wide[1], wide[1] + wide[2])
    assert keep_for(wide) == 2 and schedule(3, keep_for(wide)) == schedule(3)[:3]
    # equal hidden layers (the deep model): a second kept layer would hold 3 at the last forward
    deep = [64 * 1024 + 1024] + [1024 * 1024 + 1024] * 15 + [1024 * 10 + 10]
    assert live_peak(deep, 2) == deep[-1] + deep[-2] + deep[-3] > live_peak(deep, 1)
    assert keep_for(deep) == 1
    # a model whose last layers are small keeps them all
    assert keep_for([100, 100, 1, 1, 1]) == 4 and keep_for([100, 1]) == 1
    for sizes in ([3], [4, 5], [7, 1, 7], [1, 7, 1, 7], [5, 5, 5, 5, 5]):
        k = keep_for(sizes)
        assert 1 <= k <= max(1, len(sizes) - 1)
        assert live_peak(sizes, k) <= live_peak(sizes, 1)


def test_ledger_counts_live_arrays_and_their_peaks():
    """An array counts while anything (a view) keeps it alive; peaks per category and of the
    sum; probes added at the report; unknown categories refused."""
    ledger = MemoryLedger()
    a = ledger.track("parameters", np.zeros(100, np.float32))
    b = ledger.track("gradients", np.zeros(50, np.float32))
    view = b[10:20]
    del b
    gc.collect()
    assert ledger.live() == {"parameters": 400, "master": 0, "gradients": 200, "optimizer": 0,
                             "codec": 0, "buffers": 0}
    del view
    ledger.track("gradients", np.zeros(25, np.float32))  # made and freed at once
    assert ledger.live()["gradients"] == 0
    ledger.probe("buffers", lambda: 7)
    r = ledger.report()
    assert r["parameters"] == 400 and r["gradients"] == 200 and r["buffers"] == 7
    assert r["total"] == 607 and r["rss"] > 0
    del a
    with pytest.raises(ValueError, match="category"):
        ledger.track("activations", np.zeros(1))


def test_the_report_names_the_stage_and_the_memory_split():
    from collectives.sgd.report import final_report

    mb = 10 ** 6
    s = {"world": 4, "params": 10, "steps": 5, "codec": "none", "algorithm": "ring",
         "sync": "sync", "shard": 2, "loss": 1.0, "train_acc": 0.5, "test_acc": 0.5,
         "seconds": {"compute": 1.0}, "wall_s": 2.0, "analytic": False, "exchanges": 5,
         "bytes_mean": 100.0, "bytes_max": 100, "dense_bytes": 100, "overlap": False,
         "memory": {"parameters": 4 * mb, "gradients": 1 * mb, "optimizer": 1 * mb, "codec": 0,
                    "buffers": 2 * mb, "total": 8 * mb, "rss": 300 * mb}}
    text = final_report(s)
    assert "ZeRO stage 2 (optimizer state and gradients sharded over the ranks)" in text
    assert text.endswith("peak memory per rank (largest rank): parameters 4.00 MB, gradients "
                         "1.00 MB, optimizer state 1.00 MB, codec state 0.00 MB, buffers "
                         "2.00 MB\n  arrays held at once 8.00 MB; peak resident set size "
                         "300.00 MB")
    assert "ZeRO" not in final_report({**s, "shard": 0})
    # --shard 1|2 --param-codec: the master slice beside the replica, on its own line item
    master = final_report({**s, "memory": {**s["memory"], "master": mb // 4}})
    assert "peak memory per rank (largest rank): parameters 4.00 MB, master parameters 0.25 MB, " \
           "gradients 1.00 MB" in master
