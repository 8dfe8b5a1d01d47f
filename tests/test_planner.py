"""The planner (collectives.parallel.planner, python -m collectives.plan): its predictions equal the
formulas of docs/planner.md computed by hand, it proposes only valid configurations, bad input is
a clear error, and the command runs end to end. One process; the compute model is injected
(FlopRate) wherever a value is checked, so nothing depends on this machine's speed."""

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

import compress
from collectives.parallel import planner
from collectives.parallel.planner import network as pnet
from collectives.plan import command, measure

FLOP_S = 1e-10      # seconds per floating-point operation of the injected compute model
UPDATE_S = 1e-9     # seconds per parameter of the optimizer step
A, B = 1e-6, 1e-9   # intra alpha, beta
AX, BX = 1e-5, 8e-9  # inter alpha, beta
SPEED = {"encode": 1e-9, "decode": 2e-9, "payload": 3e-9}
SIZES = (8, 16, 16, 4)  # three layers: a pair (0, 1) and a whole last layer under tp


@pytest.fixture
def tuning(tmp_path):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({
        "format": "collectives-tuning", "version": 1,
        "world_sizes": {"8": {"rules": [{"max_bytes": None, "algorithm": "ring"}],
                              "model": {"alpha": A, "beta": B, "gamma": 0.0,
                                        "alpha_inter": AX, "beta_inter": BX, "node_size": 4}}},
        "codecs": {"fp16": SPEED, "topk:ratio=0.25": SPEED}}))
    return path


@pytest.fixture
def setup(tuning):
    w = planner.Workload(SIZES, global_batch=32)
    cl = planner.cluster(8, hosts=2, tuning=tuning)
    return w, cl, planner.FlopRate(FLOP_S, UPDATE_S)


def ring(n, p, alpha, beta):
    """The textbook ring allreduce of docs/planner.md (gamma 0, one segment)."""
    return 2 * (p - 1) * (alpha + n / p * beta)


def by_hand(shard=0, codec="none", schedule="1f1b", tuning=None, o=0.0, w=0.0, h=0.0):
    """dp 2 x pp 2 x tp 2, M 4 on 2 hosts of 4 ranks, following docs/planner.md line by line
    (``o``: the overhead per layer and micro-batch; ``w``, ``h``: the partner waits, per tp
    allreduce and per pipeline slot)."""
    r = 32 // (2 * 4)                                    # rows per micro-batch: 4
    # stage 0: the pair (0, 1), layer 0 column-split (8 x 8), layer 1 row-split (8 x 16)
    c0 = FLOP_S * (2 * r * 8 * 8 * 2 + 2 * r * 8 * 16 * 3) + 2 * o   # layer 0: no input grad
    x0 = ring(4 * r * 16, 2, A, B) + w                   # forward allreduce of the pair's output
    q0 = A + 4 * r * 16 * B + h                          # activation to stage 1, inside a host
    t0 = c0 + x0 + q0
    c1 = FLOP_S * (2 * r * 16 * 4 * 3) + o
    t1 = c1 + 0 + q0                                     # stage 1: its input gradient back
    assert t0 > t1
    # dp groups {o, o + 4}: one rank per host, 4 groups share each host's link
    tails = []
    for psi in (8 * 8 + 8 + 8 * 16 + 16, 16 * 4 + 4):
        n = 4 * psi
        if codec == "none":
            # ZeRO 3's z: stage 0's two layers and stage 1's one gather nothing again in
            # backward (the last layer's forward gather is kept, the first needs none): 1
            dp = ring(n, 2, AX, 4 * BX) * 1.0
        else:
            b = compress.from_spec(codec).payload_nbytes((psi,), np.float32)
            coding = (SPEED["encode"] + SPEED["decode"]) * n
            if codec == "fp16":
                dp = ring(b, 2, AX, 4 * BX) + coding
            else:   # allgather: (p-1) (step(8 bytes of size) + step(b)) + the payloads added
                dp = (AX + 8 * 4 * BX) + (AX + b * 4 * BX) + coding + SPEED["payload"] * 2 * b
        u = UPDATE_S * (psi // 2 if shard else psi)
        tails.append((dp + u, dp, u))
    _, dp, u = max(tails)
    M, S = 4, 2
    return dict(compute=M * c0 + u, bubble=(S - 1) * t0, dp=dp, pp=M * q0, tp=M * x0,
                step=(M + S - 1) * t0 + dp + u)


@pytest.mark.parametrize("shard,codec", [(0, "none"), (1, "none"), (0, "fp16"),
                                         (0, "topk:ratio=0.25")])  # (ZeRO 2-3: dp-only meshes)
def test_prediction_equals_the_docs_formula(setup, tuning, shard, codec):
    w, cl, compute = setup
    c = planner.Configuration(dp=2, pp=2, tp=2, micro_batches=4, shard=shard, codec=codec)
    p = planner.predict(c, w, cl, compute, tuning=tuning)
    want = by_hand(shard, codec)
    got = dict(compute=p.compute, bubble=p.bubble, dp=p.dp, pp=p.pp, tp=p.tp, step=p.step)
    assert got == pytest.approx(want, rel=1e-12)
    assert p.stages == ((0, 1), (2,))


def test_overhead_per_layer_and_micro_batch(setup, tuning):
    """The measured overhead ``o`` enters ``c_s`` once per layer, M times per step."""
    w, cl, _ = setup
    compute = planner.FlopRate(FLOP_S, UPDATE_S, overhead_s=3e-5)
    p = planner.predict(planner.Configuration(2, 2, 2, 4), w, cl, compute, tuning=tuning)
    want = by_hand(o=3e-5)
    got = dict(compute=p.compute, bubble=p.bubble, dp=p.dp, pp=p.pp, tp=p.tp, step=p.step)
    assert got == pytest.approx(want, rel=1e-12)
    assert p.step - planner.predict(planner.Configuration(2, 2, 2, 4), w, cl, setup[2],
                                    tuning=tuning).step == pytest.approx((4 + 1) * 2 * 3e-5)

    class PerMesh(planner.FlopRate):  # a calibration with a stage overhead for one mesh
        def overhead(self, mesh=None):
            return 3e-5 if mesh == (2, 2, 2) else 9.0

    p = planner.predict(planner.Configuration(2, 2, 2, 4), w, cl, PerMesh(FLOP_S, UPDATE_S),
                        tuning=tuning)
    assert p.step == pytest.approx(want["step"], rel=1e-12)


def test_partner_waits_enter_the_docs_formula(setup, tuning):
    """``w`` per tp allreduce and ``h`` per pipeline slot: in the tp and pp columns, M times,
    and in the bubble through the slowest stage's slot."""
    w, cl, _ = setup
    compute = planner.FlopRate(FLOP_S, UPDATE_S, sync_s=2e-4, handoff_s=7e-4)
    p = planner.predict(planner.Configuration(2, 2, 2, 4), w, cl, compute, tuning=tuning)
    got = dict(compute=p.compute, bubble=p.bubble, dp=p.dp, pp=p.pp, tp=p.tp, step=p.step)
    assert got == pytest.approx(by_hand(w=2e-4, h=7e-4), rel=1e-12)
    assert p.step - planner.predict(planner.Configuration(2, 2, 2, 4), w, cl, setup[2],
                                    tuning=tuning).step == pytest.approx((4 + 1) * (2e-4 + 7e-4))


def test_partner_waits_by_mesh(tuning):
    """tp alone: ``w`` on each of its allreduces (two pairs: the first's forward, the second's
    forward and backward) and ``h`` once, the step's closing wait; dp alone: ``w`` once, on
    the gradient's exchange; neither where the mesh has no partner."""
    w = planner.Workload((8, 16, 16, 16, 16, 4), global_batch=32)
    cl = planner.cluster(8, hosts=2, tuning=tuning)
    plain = planner.FlopRate(FLOP_S, UPDATE_S)
    waits = planner.FlopRate(FLOP_S, UPDATE_S, sync_s=2e-4, handoff_s=7e-4)

    def diff(c):
        a, b = (planner.predict(c, w, cl, m, tuning=tuning) for m in (waits, plain))
        return {k: getattr(a, k) - getattr(b, k) for k in ("compute", "bubble", "dp", "pp", "tp")}

    assert diff(planner.Configuration(4, 1, 2)) == pytest.approx(
        dict(compute=0, bubble=0, dp=0, pp=0, tp=3 * 2e-4 + 7e-4), abs=1e-15)
    assert diff(planner.Configuration(8, 1, 1)) == pytest.approx(
        dict(compute=0, bubble=0, dp=2e-4, pp=0, tp=0), abs=1e-15)
    assert diff(planner.Configuration(4, 2, 1, 4)) == pytest.approx(
        dict(compute=0, bubble=7e-4, dp=0, pp=4 * 7e-4, tp=0), abs=1e-15)


def test_calibrated_partner_waits_are_read_by_mesh(tmp_path):
    """A calibration's ``"partners"`` section: each mesh's own ``sync`` and ``handoff``; a
    mesh it lacks (or a file without the section) waits 0."""
    path = calibration(tmp_path / "cal.json", {"update threads=1": [1e-9],
                                                "overhead threads=1": [5e-5]}, {})
    data = json.loads(path.read_text())
    data["partners"] = {"2,2,2": {"sync": 1e-3, "handoff": 2e-3, "overhead": 7e-5},
                        "1,1,8": {"sync": 3e-3, "handoff": 0.0}}
    path.write_text(json.dumps(data))
    m = planner.MeasuredCompute(path)
    assert (m.sync(2, 2, 2), m.handoff(2, 2, 2)) == (1e-3, 2e-3)
    assert (m.sync(1, 1, 8), m.handoff(1, 1, 8)) == (3e-3, 0.0)
    assert (m.sync(8, 1, 1), m.handoff(1, 8, 1)) == (0.0, 0.0)
    # the stage's own overhead where the mesh has one, else the MLP's
    assert (m.overhead((2, 2, 2)), m.overhead((1, 1, 8)), m.overhead()) == (7e-5, 5e-5, 5e-5)
    assert planner.MeasuredCompute(None).sync(2, 2, 2) == 0.0


def test_driver_residual_enters_the_docs_formula(setup, tuning):
    """The driver residual ``s`` per step: its own column, added once to the step, every other
    column as without it."""
    w, cl, plain = setup
    c = planner.Configuration(2, 2, 2, 4)
    compute = planner.FlopRate(FLOP_S, UPDATE_S, driver_s=4e-2)
    p, q = (planner.predict(c, w, cl, m, tuning=tuning) for m in (compute, plain))
    assert p.driver == 4e-2 and q.driver == 0.0
    assert [getattr(p, k) for k in ("compute", "bubble", "dp", "pp", "tp")] == \
        [getattr(q, k) for k in ("compute", "bubble", "dp", "pp", "tp")]
    assert p.step == pytest.approx(by_hand()["step"] + 4e-2, rel=1e-12)
    assert "       s " in command.table([p]).splitlines()[0]
    assert f"{4e-2 * 1e3:>8.3f}" in command.table([p]).splitlines()[1]


def _fixed_calibration(path, partners):
    """A --calibrate file for SIZES on 8 ranks whose layer and update times are the injected
    FlopRate's (so :func:`by_hand` computes its predictions), with ``partners``."""
    flops = planner.FlopRate(FLOP_S, UPDATE_S)
    w = planner.Workload(SIZES, global_batch=32)
    times = {"update threads=1": [UPDATE_S], "overhead threads=1": [0.0]}
    from collectives.plan import calibrate
    for r, a, b, relu, g in calibrate.shapes(w, 8, (1, 2, 4), "1f1b"):
        times[f"layer {r} {a} {b} {int(relu)} {int(g)} threads=1"] = \
            list(flops.layer(r, a, b, relu, g))
    calibration(path, times, {})
    data = json.loads(path.read_text())
    data["partners"] = partners
    path.write_text(json.dumps(data))
    return path


def test_calibrated_driver_residual_in_the_prediction(tmp_path, tuning):
    """A fixed calibration file: dp 2 x pp 2 x tp 2, M 4 predicted with its mesh's stage
    overhead ``o``, waits ``w``, ``h`` and driver residual ``s`` equals docs/planner.md's
    formula by hand, ``s`` once per step in its own column; a mesh without ``s`` has 0."""
    o, wt, h, s = 3e-5, 2e-4, 7e-4, 5e-2
    path = _fixed_calibration(tmp_path / "cal.json", {
        "2,2,2": {"micro_batches": 4, "sync": wt, "handoff": h, "overhead": o, "driver": s},
        "8,1,1": {"micro_batches": 1, "sync": 0.0, "handoff": 0.0}})
    m = planner.MeasuredCompute(path)
    w = planner.Workload(SIZES, global_batch=32)
    cl = planner.cluster(8, hosts=2, tuning=tuning)
    p = planner.predict(planner.Configuration(2, 2, 2, 4), w, cl, m, tuning=tuning)
    want = by_hand(o=o, w=wt, h=h)
    got = dict(compute=p.compute, bubble=p.bubble, dp=p.dp, pp=p.pp, tp=p.tp,
               step=p.step - p.driver)
    assert got == pytest.approx(want, rel=1e-12)
    assert p.driver == s and p.step == pytest.approx(want["step"] + s, rel=1e-12)
    assert (m.driver(2, 2, 2), m.driver(8, 1, 1), m.driver(1, 1, 8)) == (s, 0.0, 0.0)
    assert planner.MeasuredCompute(None).driver(2, 2, 2) == 0.0


def test_residual_is_the_driver_step_less_the_other_terms(tmp_path, tuning):
    """calibrate.residuals: ``s`` = the measured driver step less the prediction of the same
    configuration without ``s`` (below 0 where that prediction is above the step); with ``s``
    the prediction of that configuration is the measured step, and the mesh's other
    configurations (another M, ZeRO 1) move by the same ``s``."""
    from collectives.plan import calibrate
    w = planner.Workload(SIZES, global_batch=32)
    cl = planner.cluster(8, hosts=2, tuning=tuning)
    base = {"sync": 2e-4, "handoff": 7e-4, "overhead": 3e-5}
    path = _fixed_calibration(tmp_path / "cal.json", {
        "2,2,2": {"micro_batches": 4, **base, "driver_step": 0.25},
        "2,1,4": {"micro_batches": 1, **base, "driver_step": 1e-6}})
    before = planner.MeasuredCompute(path)
    found = calibrate.residuals(path, w, cl, "1f1b")
    pred = planner.predict(planner.Configuration(2, 2, 2, 4), w, cl, before).step
    assert found["2,2,2"]["predicted"] == pytest.approx(pred, rel=1e-12)
    assert found["2,2,2"]["driver"] == pytest.approx(0.25 - pred, rel=1e-12)
    assert found["2,1,4"]["driver"] < 0
    data = json.loads(path.read_text())
    data["partners"] = found
    path.write_text(json.dumps(data))
    after = planner.MeasuredCompute(path)
    for key, c in (("2,2,2", planner.Configuration(2, 2, 2, 4)),
                   ("2,1,4", planner.Configuration(2, 1, 4, 1))):
        assert planner.predict(c, w, cl, after).step == \
            pytest.approx(found[key]["driver_step"], rel=1e-9)
    for c in (planner.Configuration(2, 2, 2, 2), planner.Configuration(2, 2, 2, 8, shard=1)):
        assert planner.predict(c, w, cl, after).step - planner.predict(c, w, cl, before).step \
            == pytest.approx(found["2,2,2"]["driver"], rel=1e-9)


def test_pipeline_residual_is_a_line_in_the_micro_batch_count(tmp_path, tuning):
    """A pipeline mesh timed at three micro-batch counts: each count's residual (its step less
    the prediction without ``s``) and the least-squares line through them. Steps whose
    residuals lie on a line are predicted exactly at every count; one off the line moves the
    fitted slope as numpy's fit of the three residuals says; the mesh's form (fp16, timed at
    the probe's count) moves with the same slope."""
    from collectives.plan import calibrate
    w = planner.Workload(SIZES, global_batch=32)
    cl = planner.cluster(8, hosts=2, tuning=tuning)
    base = {"sync": 2e-4, "handoff": 7e-4, "overhead": 3e-5}
    flat = planner.MeasuredCompute(_fixed_calibration(tmp_path / "flat.json", {
        "2,2,2": {"micro_batches": 4, **base}}))

    def bare(M, codec="none"):  # the prediction without s
        return planner.predict(planner.Configuration(2, 2, 2, M, codec=codec), w, cl,
                               flat).step

    for bump in (0.0, 5e-3):   # on the line; M = 8 off it
        line = {M: -0.02 + 3e-3 * M + (bump if M == 8 else 0.0) for M in (2, 4, 8)}
        path = _fixed_calibration(tmp_path / f"cal{bump}.json", {"2,2,2": {
            "micro_batches": 4, **base, "driver_step": bare(4) + line[4],
            "counts": {str(M): {"micro_batches": M, "driver_step": bare(M) + line[M]}
                       for M in (2, 8)},
            "forms": {"fp16": {"shard": 0, "codec": "fp16", "driver_step": bare(4, "fp16")
                               + 0.05}}}})
        found = calibrate.residuals(path, w, cl, "1f1b")["2,2,2"]
        assert found["counts"]["8"]["driver"] == pytest.approx(line[8], abs=1e-12)
        slope, at_zero = np.polyfit([4, 2, 8], [line[4], line[2], line[8]], 1)
        assert found["driver_per_micro_batch"] == pytest.approx(slope, rel=1e-9)
        assert found["driver"] == pytest.approx(at_zero + 4 * slope, rel=1e-9)
        assert (slope == pytest.approx(3e-3)) == (bump == 0.0)
        data = json.loads(path.read_text())
        data["partners"] = {"2,2,2": found}
        path.write_text(json.dumps(data))
        m = planner.MeasuredCompute(path)
        for M in (2, 4, 8):
            p = planner.predict(planner.Configuration(2, 2, 2, M), w, cl, m)
            assert p.step == pytest.approx(bare(M) + at_zero + slope * M, rel=1e-9)
            if bump == 0.0:
                assert p.step == pytest.approx(bare(M) + line[M], rel=1e-9)
            fp16 = planner.predict(planner.Configuration(2, 2, 2, M, codec="fp16"), w, cl, m)
            assert fp16.driver == pytest.approx(0.05 + slope * (M - 4), rel=1e-9)
    # without a micro-batch count (or without counts in the file) no slope
    assert m.driver(2, 2, 2) == pytest.approx(found["driver"], rel=1e-12)


def test_form_residuals_enter_the_docs_formula(tmp_path, tuning):
    """Each data-parallel form its own driver residual: a fixed calibration file whose mesh
    dp 2 x pp 2 x tp 2 has ``s`` and, under ``"forms"``, ``s`` of fp16 (and a stale one of
    ZeRO 1, which an older calibration timed): fp16 predicts the formula by hand plus its own
    ``s``; dense, ZeRO 1 (derived: the dense exchange's calls), top-k (a codec the file has no
    residual of) and a mesh without forms keep the mesh's ``s``. (With one ``s`` per mesh,
    the formula before, fp16 would get the dense ``s``.)"""
    o, wt, h, s, s1, s16 = 3e-5, 2e-4, 7e-4, 5e-2, 9e-2, 7e-2
    path = _fixed_calibration(tmp_path / "cal.json", {
        "2,2,2": {"micro_batches": 4, "sync": wt, "handoff": h, "overhead": o, "driver": s,
                  "forms": {"shard 1": {"shard": 1, "codec": "none", "driver": s1},
                            "fp16": {"shard": 0, "codec": "fp16", "driver": s16}}},
        "8,1,1": {"micro_batches": 1, "sync": 0.0, "handoff": 0.0, "driver": s}})
    m = planner.MeasuredCompute(path)
    w = planner.Workload(SIZES, global_batch=32)
    cl = planner.cluster(8, hosts=2, tuning=tuning)
    for shard, codec, want_s in ((0, "none", s), (1, "none", s), (0, "fp16", s16),
                                 (0, "topk:ratio=0.25", s)):
        c = planner.Configuration(2, 2, 2, 4, shard=shard, codec=codec)
        p = planner.predict(c, w, cl, m, tuning=tuning)
        want = by_hand(shard, codec, o=o, w=wt, h=h)
        assert p.driver == want_s
        assert p.dp == pytest.approx(want["dp"], rel=1e-12)
        assert p.step == pytest.approx(want["step"] + want_s, rel=1e-12)
    # ZeRO 1 and a ZeRO stage without its own residual take the dense one
    assert m.driver(2, 2, 2, 1, "none") == s and m.driver(2, 2, 2, 3, "none") == s
    assert m.driver(8, 1, 1, 1, "none") == s and m.driver(8, 1, 1, 0, "fp16") == s
    assert [planner.driver_form(*f) for f in ((0, "none"), (1, "none"), (2, "none"),
                                              (0, "fp16"), (1, "fp16"))] == \
        [None, None, "shard 2", "fp16", None]
    data = json.loads(path.read_text())
    data["partners"]["8,1,1"]["forms"] = {"shard 2": {"driver": s1}, "shard 3": {"driver": s16}}
    path.write_text(json.dumps(data))
    m = planner.MeasuredCompute(path)
    assert [m.driver(8, 1, 1, z, "none") for z in (0, 1, 2, 3)] == [s, s, s1, s16]
    # the closed-form model takes the same table
    flops = planner.FlopRate(FLOP_S, UPDATE_S, driver_s=s, forms={"shard 2": s1})
    assert (flops.driver(2, 2, 2), flops.driver(2, 2, 2, 1), flops.driver(2, 2, 2, 2),
            flops.driver(2, 2, 2, 3), flops.driver(2, 2, 2, 0, "fp16")) == (s, s, s1, s, s)


def test_form_residual_is_the_forms_driver_step_less_the_other_terms(tmp_path, tuning):
    """calibrate.residuals with the driver timed per data-parallel form: each form's ``s`` is
    its own driver step less the prediction of that configuration (mesh, M, ZeRO stage or
    codec) without ``s``; with them each form's configuration predicts its own measured step,
    not the dense step moved by the dense ``s``; ZeRO 1 (derived) takes the dense ``s``."""
    from collectives.plan import calibrate
    w = planner.Workload(SIZES, global_batch=32)
    cl = planner.cluster(8, hosts=2, tuning=tuning)
    base = {"sync": 2e-4, "handoff": 7e-4, "overhead": 3e-5}
    forms = {"fp16": {"shard": 0, "codec": "fp16", "driver_step": 0.27}}
    path = _fixed_calibration(tmp_path / "cal.json", {
        "2,2,2": {"micro_batches": 4, **base, "driver_step": 0.25, "forms": forms}})
    before = planner.MeasuredCompute(path)
    found = calibrate.residuals(path, w, cl, "1f1b")
    c = planner.Configuration(2, 2, 2, 4, codec="fp16")
    pred = planner.predict(c, w, cl, before).step
    assert found["2,2,2"]["forms"]["fp16"]["predicted"] == pytest.approx(pred, rel=1e-12)
    assert found["2,2,2"]["forms"]["fp16"]["driver"] == \
        pytest.approx(forms["fp16"]["driver_step"] - pred, rel=1e-12)
    data = json.loads(path.read_text())
    data["partners"] = found
    path.write_text(json.dumps(data))
    after = planner.MeasuredCompute(path)
    for codec, step in (("none", 0.25), ("fp16", 0.27)):
        c = planner.Configuration(2, 2, 2, 4, codec=codec)
        assert planner.predict(c, w, cl, after).step == pytest.approx(step, rel=1e-9)
    zero1 = planner.predict(planner.Configuration(2, 2, 2, 4, shard=1), w, cl, after)
    assert zero1.driver == pytest.approx(found["2,2,2"]["driver"], rel=1e-12)
    # another M of the mesh moves by its form's s
    c = planner.Configuration(2, 2, 2, 8, codec="fp16")
    assert planner.predict(c, w, cl, after).step - planner.predict(c, w, cl, before).step == \
        pytest.approx(found["2,2,2"]["forms"]["fp16"]["driver"], rel=1e-9)


def test_pipeline_meshes_are_timed_at_each_micro_batch_count():
    """The stage probe's meshes, each at the middle of its valid counts, and every pipeline
    mesh's other counts (those its configurations list), at which the driver's step is timed
    again; a mesh without a pipeline has one count and is timed at it only."""
    from collectives.plan import partners
    w = planner.Workload(SIZES, 32)
    mids = {m[:3]: m[3] for m in partners.meshes(w, 4, (1, 2, 4), "1f1b")}
    others = partners.other_counts(w, 4, (1, 2, 4), "1f1b")
    listed: dict = {}
    for c in planner.configurations(w, 4, ("none",), (1, 2, 4), "1f1b"):
        listed.setdefault((c.dp, c.pp, c.tp), set()).add(c.micro_batches)
    assert set(others) == {m for m in listed if m[1] > 1} == {(1, 2, 2), (2, 2, 1)}
    for m, counts in others.items():
        assert mids[m] not in counts and sorted({*counts, mids[m]}) == sorted(listed[m])
        assert len(counts) == len(listed[m]) - 1 >= 1


def test_driver_forms_of_a_mesh():
    """The forms timed beside the dense step, only where dp > 1: ZeRO 2 and 3 on a dp-only
    mesh (the only one the driver takes them on; ZeRO 1 is derived) and each codec."""
    from collectives.plan import partners
    assert partners.driver_forms((2, 1, 2, 1), ("none", "fp16")) == [(0, "fp16")]
    assert partners.driver_forms((4, 1, 1, 1), ("none",)) == [(2, "none"), (3, "none")]
    assert partners.driver_forms((1, 2, 2, 4), ("none", "fp16")) == []
    assert "--shard" in partners.driver_argv(planner.Workload(SIZES, 32), (2, 1, 1, 1),
                                             "digits", "1f1b", 1, "none")


PROBE_SCRIPT = """
import json, sys, time
from mpi4py import MPI
from collectives.parallel import planner
from collectives.plan import partners
from collectives.sgd.pipelined import MLPStage

comm = MPI.COMM_WORLD
w = planner.Workload((64, 32, 32, 32, 32, 10), 32)
plain = partners.probe(comm, w, (1, 1, 2, 1), steps=4)
if comm.rank == 1:   # rank 1 reaches every tp allreduce DELAY s late
    real = MLPStage._allreduce

    def late(self, x):
        time.sleep(DELAY)
        return real(self, x)

    MLPStage._allreduce = late
late = partners.probe(comm, w, (1, 1, 2, 1), steps=4)
if comm.rank == 0:
    print(json.dumps([plain, late]))
"""


def test_calibration_recovers_an_injected_skew(tmp_path):
    """The probe under mpiexec -n 2, tp 2: one rank made to reach every tp allreduce 40 ms
    late (inside the allreduce it times, so its partner waits 40 ms and it counts its own
    40 ms as well): the measured wait per allreduce grows by 40 ms (within 25 %), where the
    back-to-back second allreduce sees none of it."""
    from collectives.tools.launch import mpiexec_command
    script = tmp_path / "probe.py"
    script.write_text(PROBE_SCRIPT.replace("DELAY", "0.04"))
    out = subprocess.run([*mpiexec_command(), "-n", "2", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    plain, late = json.loads(out.stdout.strip().splitlines()[-1])
    assert late["sync"] - plain["sync"] == pytest.approx(0.04, rel=0.25)
    assert plain["micro_batches"] == late["micro_batches"] == 1 and plain["compute"] > 0


def calibration(path, times, network, ranks=8, threads=1):
    path.write_text(json.dumps({"format": "collectives-plan-compute", "host": "elsewhere",
                                "launch": {"ranks": ranks, "hosts": ["node0", "node1"],
                                           "threads": threads},
                                "network": network, "times": times}))
    return path


def test_calibrated_file_is_used_as_it_is(tmp_path, tuning):
    """A file written by --calibrate: its times whatever the host, its threads, no slowdown,
    its overhead and links; a shape it lacks is an error, never measured here."""
    times = {"layer 4 8 16 1 0 threads=3": [1e-3, 2e-3], "update threads=3": [1e-9],
             "overhead threads=3": [5e-5]}
    net = {"alpha_inter": 3e-5, "beta_inter": 9e-9}
    path = calibration(tmp_path / "cal.json", times, net, threads=3)
    m = planner.MeasuredCompute(path, threads=1, slowdown=4.0)
    assert (m.threads, m.slowdown, m.network) == (3, 1.0, net)
    assert m.layer(4, 8, 16, True, False) == (1e-3, 2e-3)
    assert m.update(1000) == pytest.approx(1e-6) and m.overhead() == 5e-5
    assert m.codec_speeds() == {}
    with pytest.raises(ValueError, match="calibrated inside a launch for another workload"):
        m.layer(4, 16, 16, True, True)
    assert m.measured == 0
    cl = planner.cluster(8, 2, "1gbit", tuning, m.network)
    assert (cl.net.alpha_inter, cl.net.beta_inter) == (3e-5, 9e-9)
    assert (cl.net.alpha, cl.net.beta) == (A, B)       # not measured: the tuning file's
    # outside a launch file, no overhead is assumed
    assert planner.MeasuredCompute(None).overhead() == 0.0


def test_threads_follow_the_driver():
    """The driver gives each rank cores // world threads; ranks sharing cores slow down."""
    from collectives.parallel.planner.compute import threads_per_rank
    assert threads_per_rank(1, 2, 4) == (1, 1.0)      # 4 hosts of 1 rank, 2 cores each
    assert threads_per_rank(4, 2, 4) == (1, 2.0)      # emulated: the 4 ranks share 2 cores
    assert threads_per_rank(2, 8) == (4, 1.0)
    with pytest.raises(ValueError):
        threads_per_rank(4, 2, 2)


def test_windowed_timing_is_a_rate_over_back_to_back_calls():
    """median_time: without a window each timing is one call (a warm-up, then the
    repetitions); with one, each timing runs the calls back to back for at least the window
    and is the time per call (what --calibrate uses: ranks sharing a core are timed at their
    share of it, not at the speed of a call that fit in one scheduler slice)."""
    import time

    from collectives.parallel.planner.compute import median_time
    calls = []

    def nap():
        calls.append(1)
        time.sleep(0.002)

    t = median_time(nap, 5)
    assert len(calls) == 1 + 5 and 0.002 <= t < 0.05
    calls.clear()
    t0 = time.perf_counter()
    t = median_time(nap, 5, window=0.02)
    # each of the 5 timings lasts >= 20 ms, and stops at the first call past it: naps of
    # >= 2 ms fill it in 10 at most
    assert time.perf_counter() - t0 >= 5 * 0.02
    assert 1 + 5 <= len(calls) <= 1 + 5 * 10 and 0.002 <= t < 0.05


def test_calibrate_needs_the_launch(tmp_path, capsys):
    """--calibrate outside a launch of --ranks ranks: a clear error, exit status 2."""
    assert command.main(["--hidden", "16", "--ranks", "2", "--calibrate",
                         str(tmp_path / "c.json")]) == 2
    assert "runs on the launch of --ranks 2 ranks, got 1" in capsys.readouterr().out
    assert not (tmp_path / "c.json").exists()


def test_bubble_is_the_gpipe_fraction_of_the_pipelined_time(setup):
    w, cl, _ = setup
    compute = planner.FlopRate(FLOP_S)   # no optimizer step: the step is the pipeline alone
    for m in (2, 4, 8):
        p = planner.predict(planner.Configuration(1, 2, 4, m), w, cl, compute)
        assert p.dp == 0 and p.bubble / p.step == pytest.approx(1 / (m + 1), rel=1e-9)


def test_zero3_factor_counts_the_gathers_the_driver_makes():
    """ZeRO 3's bytes over an allreduce's: 1 + the layers gathered again in backward over twice
    the parameters; the layers the driver keeps from forward (prefetch.keep_for) are not."""
    from collectives.parallel.planner.predict import zero3_factor

    wide = [64 * 4096 + 4096, 4096 * 4096 + 4096, 4096 * 10 + 10]
    assert zero3_factor(wide) == 1.0                   # layers 1 and 2 kept, layer 0 needs none
    deep = [64 * 1024 + 1024] + [1024 * 1024 + 1024] * 15 + [1024 * 10 + 10]
    assert zero3_factor(deep) == 1 + 15 * deep[1] / (2 * sum(deep))   # layers 15..1 again
    assert 1.49 < zero3_factor(deep) < 1.5
    assert zero3_factor([7]) == zero3_factor([]) == 1.0


def test_memory_estimate_by_shard_stage_and_schedule(setup):
    w, cl, compute = setup
    psi = 8 * 8 + 8 + 8 * 16 + 16
    for shard, schedule in itertools.product((0, 1), ("1f1b", "gpipe")):
        c = planner.Configuration(2, 2, 2, 4, shard, "none", schedule)
        m = planner.predict(c, w, cl, compute).memory
        assert m.params == m.grads == 4 * psi
        assert m.optimizer == 4 * psi / (2 if shard >= 1 else 1)
        in_flight = 4 if schedule == "gpipe" else 2        # stage 0 of 1F1B holds S
        assert m.activations == 4 * 4 * (8 + 8 + 16) * in_flight
    whole = 4 * (8 * 16 + 16 + 16 * 16 + 16 + 16 * 4 + 4)  # the whole model on every dp rank
    for shard in (0, 1, 2, 3):  # ZeRO 2-3 on data-parallel meshes only
        m = planner.predict(planner.Configuration(8, 1, 1, 1, shard), w, cl, compute).memory
        assert m.params == whole / (8 if shard >= 3 else 1)
        assert m.grads == whole / (8 if shard >= 2 else 1)
        assert m.optimizer == whole / (8 if shard >= 1 else 1)
    m = planner.predict(planner.Configuration(2, 2, 2, 4, 0, "topk:ratio=0.25"), w, cl,
                        compute).memory
    assert m.optimizer == 2 * 4 * psi                      # momentum + error feedback residual


def test_axis_placement_megatron_order(setup):
    _, cl, _ = setup
    assert pnet.axis_groups("tp", 2, 2, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert pnet.axis_groups("pp", 2, 2, 2) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert pnet.axis_groups("dp", 2, 2, 2) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert not pnet.group_network(cl, pnet.axis_groups("tp", 2, 2, 2)).two_level
    dp = pnet.group_network(cl, pnet.axis_groups("dp", 2, 2, 2))
    assert (dp.node_size, dp.beta_inter) == (1, 4 * BX)
    dp = pnet.group_network(cl, pnet.axis_groups("dp", 8, 1, 1))   # one group, 4 ranks a host
    assert (dp.node_size, dp.beta_inter) == (4, BX)
    # a pipeline boundary crossing hosts: 4 pairs leave host 0 at once
    assert pnet.p2p_seconds(cl, [(0, 4), (1, 5), (2, 6), (3, 7)], 100) == AX + 4 * 100 * BX


def test_partition_is_optimal():
    rng = np.random.default_rng(1)
    for n in range(1, 7):
        weights = list(rng.random(n))
        for parts in range(1, n + 1):
            groups = planner.partition(weights, parts)
            assert [i for g in groups for i in g] == list(range(n)) and all(groups)
            best = min(max(sum(weights[a:b]) for a, b in zip((0, *cuts), (*cuts, n)))
                       for cuts in itertools.combinations(range(1, n), parts - 1))
            assert max(sum(weights[i] for i in g) for g in groups) == pytest.approx(best)
    with pytest.raises(ValueError, match="cannot cut"):
        planner.partition([1.0, 2.0], 3)


@pytest.mark.parametrize("sizes,ranks", [((8, 16, 16, 4), 8), ((64, 12, 12, 10), 8),
                                          ((64, 256, 128, 10), 6), ((64, 32, 10), 4),
                                          ((64, 8, 8, 8, 8, 8, 10), 12), ((4, 2), 3),
                                          ((64, 4096, 4096, 10), 1)])
def test_every_proposed_configuration_is_valid(sizes, ranks):
    w = planner.Workload(sizes, global_batch=32 * ranks)
    codecs = ("none", "fp16", "topk:ratio=0.01")
    got = list(planner.configurations(w, ranks, codecs, (1, 2, 4)))
    assert got and len(set(got)) == len(got)
    for c in got:
        assert c.dp * c.pp * c.tp == ranks
        assert all(h % c.tp == 0 for h in sizes[1:-1])
        assert c.pp <= len(w.blocks(c.tp)) <= len(sizes) - 1
        assert c.micro_batches >= c.pp and (c.pp > 1 or c.micro_batches == 1)
        assert w.global_batch % (c.dp * c.micro_batches) == 0
        assert c.shard == 0 or (c.dp > 1 and c.codec == "none")
        assert c.shard <= 1 or c.pp == c.tp == 1  # as the driver takes them
        assert c.codec == "none" or c.dp > 1
        assert planner.why_invalid(c, w, ranks) is None
    # and none is missing: every (dp, pp, tp) that the rules allow is there
    allowed = {(dp, pp, tp) for dp, pp, tp in itertools.product(range(1, ranks + 1), repeat=3)
               if dp * pp * tp == ranks and all(h % tp == 0 for h in sizes[1:-1])
               and pp <= len(w.blocks(tp)) and (tp == 1 or len(sizes) > 2)}
    assert {(c.dp, c.pp, c.tp) for c in got} == allowed


@pytest.mark.parametrize("config,match", [
    (planner.Configuration(2, 2, 1, 4), "not the 8 ranks"),
    (planner.Configuration(1, 1, 8, 1, codec="fp16"), "needs dp > 1"),
    (planner.Configuration(4, 2, 1, 1), "micro-batches 1 < pp 2"),
    (planner.Configuration(1, 8, 1, 8), "exceeds the 3 blocks"),
    (planner.Configuration(2, 1, 4, 1, shard=4), "ZeRO stages"),
    (planner.Configuration(8, 1, 1, 1, shard=1, codec="fp16"), "shard 0"),
    (planner.Configuration(4, 2, 1, 2, shard=2), "data-parallel mesh only"),
    (planner.Configuration(2, 1, 4, 1, shard=3), "data-parallel mesh only"),
    (planner.Configuration(1, 2, 4, 3), "does not divide"),
])
def test_invalid_configuration_is_refused(setup, config, match):
    w, cl, compute = setup
    with pytest.raises(ValueError, match=match):
        planner.predict(config, w, cl, compute)


def test_bad_network_and_ranks(tuning, tmp_path):
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        planner.cluster(0)
    for bad in ("fast", "1gb/s", "-1gbit", "0gbit", ""):
        with pytest.raises(ValueError, match="cannot read the network rate"):
            planner.parse_rate(bad)
    assert planner.parse_rate("2.5gbit") == 2.5e9 and planner.parse_rate("100mbit") == 1e8
    with pytest.raises(ValueError, match="must be >= 1 and divide the 8 ranks"):
        planner.cluster(8, hosts=3)
    one_level = tmp_path / "one.json"
    one_level.write_text(json.dumps({"format": "collectives-tuning", "version": 1, "world_sizes": {
        "4": {"rules": [{"max_bytes": None, "algorithm": "ring"}],
              "model": {"alpha": A, "beta": B, "gamma": 0.0}}}}))
    with pytest.raises(ValueError, match="give --network RATE"):
        planner.cluster(4, hosts=2, tuning=one_level)
    assert planner.cluster(4, 2, "1gbit", one_level).net.beta_inter == 8e-9
    with pytest.raises(ValueError, match="codec 'nope'"):
        planner.codec_of("nope")


@pytest.mark.parametrize("argv,match", [
    (["--ranks", "0"], "must be a positive integer"),
    (["--ranks", "8", "--network", "fast"], "cannot read the network rate"),
    (["--ranks", "8", "--hosts", "3"], "divide the 8 ranks"),
    (["--ranks", "4", "--codecs", "none,nope"], "codec 'nope'"),
    (["--ranks", "4", "--measure"], "--measure needs --run"),
    (["--ranks", "4", "--tuning", "/nonexistent/tuning.json"], "tuning.json: no such file"),
    (["--ranks", "4", "--hidden", "16,0"], "positive integer"),
])
def test_command_bad_input_is_an_argparse_error(argv, match, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        command.main([*argv, "--compute-cache", str(tmp_path / "c.json")])
    assert exc.value.code == 2
    assert match in capsys.readouterr().err


def test_command_end_to_end(tmp_path, tuning, capsys):
    cache = tmp_path / "compute.json"
    argv = ["--hidden", "16,16", "--ranks", "4", "--hosts", "2", "--network", "1gbit",
            "--compute-cache", str(cache), "--top", "6", "--run", "3"]
    out = subprocess.run([sys.executable, "-m", "collectives.plan", *argv], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    head = next(i for i, l in enumerate(lines) if l.lstrip().startswith("#"))
    rows = lines[head + 1:head + 7]
    assert [int(r.split()[0]) for r in rows] == [1, 2, 3, 4, 5, 6]
    steps = [float(r.split()[7]) for r in rows]
    assert steps == sorted(steps) and steps[0] > 0
    for r in rows:   # dp x pp x tp = 4
        dp, pp, tp = map(int, r.split()[1:4])
        assert dp * pp * tp == 4
    commands = [l.strip() for l in lines if "python -m collectives.sgd" in l]
    assert len(commands) == 3 and all(c.startswith("mpiexec -n 4 -ppn 2 ") for c in commands)
    cached = json.loads(cache.read_text())
    assert cached["format"] == "collectives-plan-compute" and cached["times"]
    # the second run (in this process) measures nothing new and prints the same rows
    assert command.main(argv) == 0
    again = capsys.readouterr().out
    assert "(0 shape(s) measured now" in again and again.splitlines()[head + 1:] == lines[head + 1:]


def test_driver_flags_and_unknown_flags():
    c = planner.Configuration(2, 2, 2, 4, 0, "fp16", "gpipe")
    assert measure.driver_flags(c, 16) == ["--batch-size", "16", "--mesh", "dp=2,pp=2,tp=2",
                                           "--micro-batches", "4", "--schedule", "gpipe",
                                           "--codec", "fp16"]
    assert measure.driver_flags(planner.Configuration(2, 1, 2), 8) == [
        "--batch-size", "8", "--mesh", "dp=2,pp=1,tp=2"]
    assert measure.driver_flags(planner.Configuration(4, 1, 1, shard=3), 8) == [
        "--batch-size", "8", "--shard", "3"]
    base = ["mpiexec", "-n", "2", "python", "-m", "collectives.sgd", "--batch-size", "4"]
    assert measure.unknown_flags(base) == []
    assert measure.unknown_flags([*base, "--no-such-flag", "3"]) == ["--no-such-flag"]


def test_measure_skips_what_the_driver_does_not_accept(setup, capsys):
    w, cl, compute = setup
    p = planner.predict(planner.Configuration(8, 1, 1), w, cl, compute)
    argv = ["mpiexec", "-n", "8", "python", "-m", "collectives.sgd", "--no-such-flag", "2"]
    measure.run_all([p], [argv], sys.stdout)
    out = capsys.readouterr().out
    assert "not run: the SGD driver here does not accept --no-such-flag" in out


def test_measure_runs_the_driver(tmp_path):
    """--run 1 --measure on one rank: the driver runs and its median step is printed."""
    out = subprocess.run(
        [sys.executable, "-m", "collectives.plan", "--hidden", "16", "--ranks", "1",
         "--compute-cache", str(tmp_path / "c.json"), "--run", "1", "--measure"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.strip().startswith("#1 dp 1"))
    assert "predicted" in line and "measured" in line, out.stdout
    assert float(line.split("measured ")[1].split(" ms")[0]) > 0


def test_calibrate_inside_a_launch(tmp_path):
    """mpiexec -n 2 ... --calibrate: every shape the planner needs, measured on both ranks at
    once, and the link between them; the planner then reads the file as it is."""
    from collectives.tools.launch import mpiexec_command
    cal = tmp_path / "cal.json"
    args = ["--hidden", "16,16", "--ranks", "2", "--micro-factors", "1,2", "--codecs", "none,fp16"]
    out = subprocess.run([*mpiexec_command(), "-n", "2", sys.executable, "-m",
                          "collectives.plan", *args, "--calibrate", str(cal)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(cal.read_text())
    from collectives.plan import calibrate
    assert data["launch"]["ranks"] == 2 and data["launch"]["threads"] >= 1
    assert set(data["network"]) == {"alpha", "beta"}
    assert data["network"]["alpha"] >= 0 and data["network"]["beta"] >= 0
    assert data["network"]["alpha"] + data["network"]["beta"] > 0
    assert [int(n) for n in data["probes"]["host"]] == list(calibrate.PROBE_SIZES)
    assert all(t > 0 for t in data["probes"]["host"].values())
    assert set(data["codecs"]) == {"fp16"} and data["codecs"]["fp16"]["encode"] > 0
    # the partner waits of every mesh a configuration uses (dp 2; pp 2, M the middle of 2, 4;
    # tp 2), none below 0; no pipeline: no messages to take out of the slot
    assert set(data["partners"]) == {"2,1,1", "1,2,1", "1,1,2"}
    assert data["partners"]["1,2,1"]["micro_batches"] == 4
    # the pipeline mesh's driver step also at its other count (2); through two counts the
    # line of residuals is exact
    again = data["partners"]["1,2,1"]["counts"]
    assert list(again) == ["2"] and again["2"]["driver_step"] > 0
    assert all("counts" not in v for k, v in data["partners"].items() if k != "1,2,1")
    assert all(v[k] >= 0 for v in data["partners"].values() for k in ("sync", "handoff"))
    assert data["partners"]["1,1,2"]["messages"] == 0 < data["partners"]["1,2,1"]["messages"]
    # the pipelined stage's overhead where the driver runs one (not on dp alone: its MLP's)
    assert {k for k, v in data["partners"].items() if "overhead" in v} == {"1,2,1", "1,1,2"}
    # the driver's own step on every mesh, and its residual: with it, the prediction of the
    # configuration the driver ran is that step
    assert all(v["driver_step"] > 0 for v in data["partners"].values())
    cl = planner.cluster(2, 1, None, None, data["network"])
    m = planner.MeasuredCompute(cal)
    for key, v in data["partners"].items():
        dp, pp, tp = map(int, key.split(","))
        assert v["driver"] == pytest.approx(v["driver_step"] - v["predicted"], rel=1e-9)
        c = planner.Configuration(dp, pp, tp, v["micro_batches"])
        assert planner.predict(c, planner.Workload((64, 16, 16, 10), 64), cl, m).step == \
            pytest.approx(v["driver_step"], rel=1e-9)
    c = planner.Configuration(1, 2, 1, 2)
    assert planner.predict(c, planner.Workload((64, 16, 16, 10), 64), cl, m).step == \
        pytest.approx(again["2"]["driver_step"], rel=1e-9)
    # on the dp mesh also the driver with ZeRO 2-3 and with fp16, each with its own s
    forms = data["partners"]["2,1,1"]["forms"]
    assert set(forms) == {"shard 2", "shard 3", "fp16"}
    assert not any("forms" in data["partners"][k] for k in ("1,2,1", "1,1,2"))
    for f in forms.values():
        assert f["driver_step"] > 0
        assert f["driver"] == pytest.approx(f["driver_step"] - f["predicted"], rel=1e-9)
        c = planner.Configuration(2, 1, 1, 1, shard=f["shard"], codec=f["codec"])
        assert planner.predict(c, planner.Workload((64, 16, 16, 10), 64), cl, m).step == \
            pytest.approx(f["driver_step"], rel=1e-9)
    from collectives.plan import calibrate
    w = planner.Workload((64, 16, 16, 10), 64)
    want = {f"layer {r} {a} {b} {int(relu)} {int(g)} threads={data['launch']['threads']}"
            for r, a, b, relu, g in calibrate.shapes(w, 2, (1, 2), "1f1b")}
    assert want and want <= set(data["times"]) and all(
        t >= 0 for v in data["times"].values() for t in v)
    listing = subprocess.run([sys.executable, "-m", "collectives.plan", *args,
                              "--compute-cache", str(cal)], capture_output=True, text=True,
                             timeout=300)
    assert listing.returncode == 0, listing.stderr
    assert "measured inside the launch" in listing.stdout


def test_link_fit_recovers_the_cost_model(tuning):
    """The least-squares fit of --calibrate gives back alpha_inter and beta_inter from ring
    allreduce times the cost model itself produced (at the five probe sizes), within 0.1 %: the
    model is linear in them but for its segment pipelining."""
    from dataclasses import replace
    from collectives.plan import calibrate
    from collectives.selection.cost_model import predict as cost
    cl = planner.cluster(8, 2, tuning=tuning)
    g = pnet.group_network(cl, [list(range(8))])
    true = replace(g, alpha_inter=2e-3, beta_inter=9e-9)
    times = {n: cost("ring", float(n), 8, true) for n in calibrate.PROBE_SIZES}
    a, b = calibrate._fit(times, 8, g, ("alpha_inter", "beta_inter"))
    assert calibrate._fit({n: 1.0 for n in calibrate.PROBE_SIZES}, 8, g.intra(),
                          ("alpha_inter", "beta_inter")) == (None, None)   # not seen at all
    assert (a, b) == (pytest.approx(2e-3, rel=1e-3), pytest.approx(9e-9, rel=1e-3))
