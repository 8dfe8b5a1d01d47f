"""Whole training runs of ``python -m collectives.sgd`` under mpiexec, as subprocesses with timeouts.

These are the heavier comparisons (digits, a few epochs, mostly 4 ranks), run once rather than at
every world size of the multi-rank suite: 1 vs 4 ranks, codecs with error feedback against dense,
resume-after-stop and resume-after-SIGKILL bit for bit, and clean exits on bad arguments.
"""

import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from collectives.tools.launch import mpiexec_command as mpiexec

TIMEOUT_S = 180
#: the accuracy comparisons: digits, 15 epochs, base lr 0.1 (peak 0.05 at 128 samples a step)
ACCURACY = ["--epochs", "15", "--lr", "0.1", "--quiet"]
#: tiny runs for checkpoint tests
TINY = ["--subset", "400", "--epochs", "3", "--hidden", "32", "--batch-size", "8", "--quiet"]


def _run(n, args, tmp_path=None, check=True):
    cmd = [*mpiexec(), "-n", str(n), sys.executable, "-m", "collectives.sgd", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _train(n, args, tmp_path, name):
    log = tmp_path / f"{name}.json"
    _run(n, [*args, "--log", str(log)])
    return json.loads(log.read_text())["summary"]


@pytest.fixture(scope="module")
def dense4(tmp_path_factory):
    return _train(4, [*ACCURACY, "--check-replicas"], tmp_path_factory.mktemp("dense"), "dense")


def test_one_rank_and_four_ranks_agree(dense4, tmp_path):
    one = _train(1, [*ACCURACY, "--batch-size", "128"], tmp_path, "one")
    assert abs(one["test_acc"] - dense4["test_acc"]) <= 0.01
    assert dense4["test_acc"] > 0.9 and dense4["world"] == 4


@pytest.mark.parametrize("codec", ["topk:ratio=0.01", "efsignsgd", "qsgd"])
def test_codecs_with_error_feedback_match_dense(dense4, tmp_path, codec):
    s = _train(4, [*ACCURACY, "--codec", codec, "--error-feedback"], tmp_path, "codec")
    assert s["test_acc"] >= dense4["test_acc"] - 0.015, (s["test_acc"], dense4["test_acc"])
    assert s["bytes_mean"] < s["dense_bytes"]
    t = s["seconds"]  # the codec's time, split into encoding and decoding
    assert t["encode"] > 0 and t["decode"] > 0
    assert t["encode"] + t["decode"] == pytest.approx(t["codec"], rel=1e-9)


def test_dgc_as_published_matches_dense(dense4, tmp_path):
    """Momentum correction, factor masking and the sparsity warm-up (Lin et al. 2018): within
    1.5 points of dense at 1 % density."""
    s = _train(4, [*ACCURACY, "--codec", "dgc:density=0.01", "--momentum-correction",
                   "--sparsity-warmup", "4", "--check-replicas"], tmp_path, "dgc")
    assert s["test_acc"] >= dense4["test_acc"] - 0.015, (s["test_acc"], dense4["test_acc"])
    assert "momentum correction" in s["codec"] and s["bytes_mean"] < s["dense_bytes"] / 4


@pytest.mark.parametrize("comm", [
    ["--codec", "qsgd", "--error-feedback"],                # private RNG + per-rank residuals
    ["--codec", "powersgd:rank=2"],                         # warm-start Q
    ["--codec", "efsignsgd", "--strategy", "two_phase"],    # server-side residuals
    ["--sync", "local:4"],                                  # local SGD: per-rank momentum
    ["--codec", "powersgd:rank=2", "--overlap", "--bucket-mb", "0.004"],  # state per bucket
    ["--codec", "powersgd:rank=2", "--dense-steps", "40"],  # resumed in the dense steps
    ["--codec", "powersgd:rank=2", "--dense-steps", "20"],  # ... and after them
    ["--codec", "dgc:density=0.05", "--momentum-correction",  # DGC: momentum, velocity and
     "--sparsity-warmup", "2", "--clip", "1"],              # a warm-up the stop falls in
])
def test_resume_after_stop_is_bitwise(tmp_path, comm):
    args = [*TINY, *comm]
    _run(2, [*args, "--save-params", str(tmp_path / "whole.npy")])
    ck = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "16"]
    _run(2, [*args, *ck, "--stop-after", "41"])    # last checkpoint at step 32, after epoch 1
    _run(2, [*args, *ck, "--resume", "--save-params", str(tmp_path / "resumed.npy")])
    assert (tmp_path / "whole.npy").read_bytes() == (tmp_path / "resumed.npy").read_bytes()


def test_gossip_trains(dense4, tmp_path):
    """D-PSGD at 4 ranks on the one-peer exponential graph reaches dense training's accuracy
    within 1.5 points; the replicas end close to their average; one message of the parameters
    per rank and step."""
    s = _train(4, [*ACCURACY, "--sync", "gossip:one_peer_exponential"], tmp_path, "gossip")
    assert s["test_acc"] >= dense4["test_acc"] - 0.015 and s["test_acc"] > 0.9, \
        (s["test_acc"], dense4["test_acc"])
    assert 0 <= s["consensus"] < 0.01, s["consensus"]
    assert s["bytes_mean"] == s["steps"] * s["params"] * 4


def test_gossip_resume_after_stop_is_bitwise(tmp_path):
    """Every rank's own parameters and momentum are saved and restored (3 ranks, a graph that
    changes every step): the resumed run ends with the same bits as the whole one."""
    _assert_resumes_bitwise(tmp_path, [*TINY, "--sync", "gossip:one_peer_exponential"])


def _assert_resumes_bitwise(tmp_path, args):
    """A 3-rank run of ``args`` stopped after 30 steps (checkpoints every 7) and resumed ends
    with the bits of the whole run (``whole.npy``); returns the checkpoint options."""
    _run(3, [*args, "--save-params", str(tmp_path / "whole.npy")])
    ck = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "7"]
    _run(3, [*args, *ck, "--stop-after", "30"])
    _run(3, [*args, *ck, "--resume", "--save-params", str(tmp_path / "resumed.npy")])
    assert (tmp_path / "whole.npy").read_bytes() == (tmp_path / "resumed.npy").read_bytes()
    return ck


def test_gossip_with_overlap_resumes_bitwise_and_refuses_what_it_cannot_do(tmp_path):
    """--sync gossip:GRAPH --overlap (the round of x_t during forward and backward): a stopped
    and resumed run ends with the bits of the whole one (no round is in flight between steps);
    its run differs from the mixing after the update (another algorithm); with --codec
    (CHOCO-SGD) or gossip:nodes it is refused on every rank."""
    _assert_resumes_bitwise(tmp_path, [*TINY, "--sync", "gossip:one_peer_exponential",
                                       "--overlap"])
    _run(3, [*TINY, "--sync", "gossip:one_peer_exponential",
             "--save-params", str(tmp_path / "after.npy")])
    assert (tmp_path / "whole.npy").read_bytes() != (tmp_path / "after.npy").read_bytes()
    for extra in (["--sync", "gossip:ring", "--codec", "topk:ratio=0.1"],
                  ["--sync", "gossip:nodes"]):
        _assert_clean_error(_run(2, [*TINY, "--overlap", *extra], check=False), 2,
                            "--overlap mixes the parameters during forward and backward")


def test_gossip_in_float16_resumes_bitwise(tmp_path):
    """--gossip-dtype float16 with --overlap (3 ranks, a graph that changes every step): a
    stopped and resumed run ends with the bits of the whole one; its run is not the float32
    one; a checkpoint of it is not resumed as a float32 run."""
    args = [*TINY, "--sync", "gossip:one_peer_exponential", "--overlap"]
    ck = _assert_resumes_bitwise(tmp_path, [*args, "--gossip-dtype", "float16"])
    _run(3, [*args, "--save-params", str(tmp_path / "full.npy")])
    assert (tmp_path / "whole.npy").read_bytes() != (tmp_path / "full.npy").read_bytes()
    proc = _run(3, [*args, *ck, "--resume"], check=False)
    assert proc.returncode != 0 and "gossip_dtype" in proc.stderr, proc.stderr[-2000:]


def test_gossip_evaluates_the_average_without_changing_the_run(tmp_path):
    """--eval-model average tests the replicas' average (3 ranks, a graph that changes every
    step) and gives back each rank's own replica: the same training losses and the same final
    bits as --eval-model own; only the test numbers may differ. Not under synchronous SGD."""
    args = [*TINY, "--sync", "gossip:one_peer_exponential"]
    logs = {}
    for how in ("own", "average"):
        _run(3, [*args, "--eval-model", how, "--log", str(tmp_path / f"{how}.json"),
                 "--save-params", str(tmp_path / f"{how}.npy")])
        logs[how] = json.loads((tmp_path / f"{how}.json").read_text())["epochs"]
    assert (tmp_path / "own.npy").read_bytes() == (tmp_path / "average.npy").read_bytes()
    assert [r["loss"] for r in logs["own"]] == [r["loss"] for r in logs["average"]]
    assert [r["consensus"] for r in logs["own"]] == [r["consensus"] for r in logs["average"]]
    assert all(0 <= r["test_acc"] <= 1 for r in logs["average"])
    assert [r["test_loss"] for r in logs["own"]] != [r["test_loss"] for r in logs["average"]]
    _assert_clean_error(_run(2, [*TINY, "--eval-model", "average"], check=False), 2,
                        "--eval-model average applies where every rank keeps its own")


def test_adpsgd_trains_as_gossip_does(tmp_path):
    """AD-PSGD at 4 ranks on the ring (one asynchronous pairwise average per step) reaches what
    synchronous D-PSGD on the same ring reaches in the same epochs, within 2 points, above 90 %;
    the replicas end close to their average; 2n bytes (a get and a put) per rank and step."""
    gossip = _train(4, [*ACCURACY, "--sync", "gossip:ring"], tmp_path, "ring")
    s = _train(4, [*ACCURACY, "--sync", "adpsgd"], tmp_path, "adpsgd")
    assert s["test_acc"] >= gossip["test_acc"] - 0.02 and s["test_acc"] > 0.9, \
        (s["test_acc"], gossip["test_acc"])
    assert 0 <= s["consensus"] < 0.01, s["consensus"]
    assert s["bytes_mean"] == s["steps"] * 2 * s["params"] * 4


def test_stale_synchronous_trains_and_resumes(dense4, tmp_path):
    """A parameter server with staleness 1 at 4 ranks reaches dense training's accuracy within
    1.5 points. Resumed from a checkpoint (3 ranks, ssp:0; the server's parameters and every
    rank's momentum), it ends where the whole run ends, to rounding (the pushes add up in any
    order: not bit for bit)."""
    s = _train(4, [*ACCURACY, "--sync", "ssp:1"], tmp_path, "ssp")
    assert s["test_acc"] >= dense4["test_acc"] - 0.015 and s["test_acc"] > 0.9, \
        (s["test_acc"], dense4["test_acc"])
    args = [*TINY, "--sync", "ssp:0"]
    _run(3, [*args, "--save-params", str(tmp_path / "whole.npy")])
    ck = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "7"]
    _run(3, [*args, *ck, "--stop-after", "30"])
    _run(3, [*args, *ck, "--resume", "--save-params", str(tmp_path / "resumed.npy")])
    whole, resumed = np.load(tmp_path / "whole.npy"), np.load(tmp_path / "resumed.npy")
    assert np.allclose(whole, resumed, rtol=1e-4, atol=1e-5)


def test_resume_after_sigkill_is_bitwise(tmp_path):
    args = [*TINY, "--epochs", "30", "--codec", "topk:ratio=0.05"]
    _run(2, [*args, "--save-params", str(tmp_path / "whole.npy")])
    ckdir = tmp_path / "ck"
    cmd = [*mpiexec(), "-n", "2", sys.executable, "-m", "collectives.sgd", *args,
           "--checkpoint-dir", str(ckdir), "--checkpoint-every", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + TIMEOUT_S
    while not (ckdir / "checkpoint.npz").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # well into the run, likely during a checkpoint write
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _run(2, [*args, "--checkpoint-dir", str(ckdir), "--resume",
             "--save-params", str(tmp_path / "resumed.npy")])
    assert np.array_equal(np.load(tmp_path / "whole.npy"), np.load(tmp_path / "resumed.npy"))


def _assert_clean_error(proc, n, message):
    # every one of the n ranks exits with 2, and the message is printed once (by rank 0), not n times
    parts = proc.stderr.split("collectives.sgd: error: ")[1:]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(parts) == 1 and message in parts[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout and "usage:" not in proc.stderr


def test_bad_codec_exits_cleanly_on_every_rank():
    _assert_clean_error(_run(3, ["--codec", "bogus"], check=False), 3, "unknown codec 'bogus'")
    _assert_clean_error(_run(2, ["--codec", "topk:k=5"], check=False), 2,
                        "topk has no parameter 'k'; its parameters are: ratio")


def test_help_is_printed_once():
    proc = _run(3, ["--help"], check=False)
    assert proc.returncode == 0 and proc.stdout.count("usage:") == 1, proc.stdout[-2000:]


def test_checkpoint_from_other_world_or_model_or_corrupt(tmp_path):
    ck = ["--checkpoint-dir", str(tmp_path), "--checkpoint-every", "5"]
    _run(2, [*TINY, *ck, "--stop-after", "5"])
    _assert_clean_error(_run(3, [*TINY, *ck, "--resume"], check=False), 3, "written by 2 ranks")
    _assert_clean_error(_run(2, [*TINY, "--hidden", "8", *ck, "--resume"], check=False), 2,
                        "another model")
    (tmp_path / "checkpoint.npz").write_bytes(b"\0" * 100)
    _assert_clean_error(_run(2, [*TINY, *ck, "--resume"], check=False), 2, "cannot read")


# ---------------------------------------------------------------- hostile checkpoints (issue 11)
def _npy(array):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(array), allow_pickle=True)
    return buf.getvalue()


def _claiming(shape, data=b""):
    """A float32 .npy whose header claims ``shape`` (padding kept), followed by ``data``."""
    head = _npy(np.zeros(1, np.float32))[:-4]
    new = head.replace(b"(1,)", repr(tuple(shape)).encode())
    cut = len(new) - len(head)
    return new[:-1 - cut] + b"\n" + data if cut else new + data


def _write_npz(path, members, deflate=()):
    with zipfile.ZipFile(path, "w") as zf:
        for name, blob in members.items():
            zf.writestr(name + ".npy", blob if isinstance(blob, bytes) else _npy(blob),
                        zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED)


def _meta(arrays, **change):
    meta = json.loads(str(arrays["meta"]))
    meta.update(change)
    return np.array(json.dumps(meta))


#: name -> (edit of {member: array or raw .npy bytes}, deflated members, message); the
#: checkpoint is TINY on 2 ranks at step 5 (without --codec unless the name says so)
HOSTILE = {
    "params of shape (1,)": (lambda a: a.update({"shared/params": a["shared/params"][:1]}), (),
                             "shared/params of float32 of shape (1,), expected float32 of shape"),
    "params of float16": (lambda a: a.update({"shared/params": a["shared/params"].astype("f2")}),
                          (), "shared/params of float16"),
    "header claims 2**33": (lambda a: a.update({"shared/params": _claiming((1 << 33,))}), (),
                            "of shape (8589934592,)"),
    "header claims 10**12": (lambda a: a.update({"rank1/stats": _claiming((10**6, 10**6))}), (),
                             "rank1/stats of float32 of shape (1000000, 1000000)"),
    "zip bomb": (lambda a: a.update({"shared/momentum": _npy(np.zeros(8 << 20, np.float32))}),
                 ("shared/momentum",), "would expand to 33554560 bytes"),
    "missing momentum": (lambda a: a.pop("shared/momentum"), (), "lacks shared/momentum"),
    "extra member": (lambda a: a.update({"shared/evil": np.zeros(3)}), (),
                     "members this run does not write: shared/evil"),
    "pickled stats": (lambda a: a.update({"rank0/stats": np.array([{}], dtype=object)}), (),
                      "rank0/stats of object"),
    "clock is a list": (lambda a: a.update(meta=_meta(a, clock=[1, 2])), (), "clock"),
    "negative step": (lambda a: a.update(meta=_meta(a, step=-1)), (), "step -1"),
    "step 10**9": (lambda a: a.update(meta=_meta(a, step=10**9)), (), "step 1000000000"),
    "elapsed NaN": (lambda a: a.update(meta=_meta(a, elapsed=float("nan"))), (), "elapsed nan"),
    "meta nested 100000 deep": (lambda a: a.update(meta=np.array("[" * 100_000)), (),
                                "meta that is not JSON"),
    "codec: residual of shape (1,)": (
        lambda a: a.update({"rank1/compression/memory/error/grads": np.zeros(1, np.float32)}), (),
        "rank1/compression/memory/error/grads of float32 of shape (1,)"),
    "codec: generator state garbage": (
        lambda a: a.update({"rank0/compression/codec/rng": np.array("{]")}), (),
        "rank 0's compression state does not load"),
}
CODEC_CK = ["--codec", "dgc:density=0.1"]  # error feedback and a private generator


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A valid checkpoint of a TINY 2-rank run at step 5, without and with a codec."""
    made = {}
    for codec in ((), tuple(CODEC_CK)):
        d = tmp_path_factory.mktemp("ck")
        _run(2, [*TINY, *codec, "--checkpoint-dir", str(d), "--checkpoint-every", "5",
                 "--stop-after", "5"])
        with np.load(d / "checkpoint.npz", allow_pickle=False) as f:
            made[codec] = {k: f[k] for k in f.files}
    return made


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_checkpoint_is_one_line_exit_2(checkpoints, tmp_path, case):
    """Rank 0 checks the file against what this run writes before it reads the data, and every
    rank exits 2 with one line: no hang, MemoryError, traceback or silent resume."""
    edit, deflate, message = HOSTILE[case]
    codec = CODEC_CK if case.startswith("codec:") else []
    arrays = dict(checkpoints[tuple(codec)])
    edit(arrays)
    _write_npz(tmp_path / "checkpoint.npz", arrays, deflate)
    assert (tmp_path / "checkpoint.npz").stat().st_size < 500_000  # the bomb: 33 KB
    t0 = time.monotonic()
    proc = _run(2, [*TINY, *codec, "--checkpoint-dir", str(tmp_path), "--resume"], check=False)
    _assert_clean_error(proc, 2, message)
    assert time.monotonic() - t0 < 60
