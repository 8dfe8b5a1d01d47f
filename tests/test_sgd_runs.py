"""Whole training runs of ``python -m collectives.sgd`` under mpiexec, as subprocesses with timeouts.

These are the heavier comparisons (digits, a few epochs, mostly 4 ranks), run once rather than at
every world size of the multi-rank suite: 1 vs 4 ranks, codecs with error feedback against dense,
resume-after-stop and resume-after-SIGKILL bit for bit, and clean exits on bad arguments.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from collectives.launch import mpiexec_command as mpiexec

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


@pytest.mark.parametrize("comm", [
    ["--codec", "qsgd", "--error-feedback"],                # private RNG + per-rank residuals
    ["--codec", "powersgd:rank=2"],                         # warm-start Q
    ["--codec", "efsignsgd", "--strategy", "two_phase"],    # server-side residuals
    ["--sync", "local:4"],                                  # local SGD: per-rank momentum
])
def test_resume_after_stop_is_bitwise(tmp_path, comm):
    args = [*TINY, *comm]
    _run(2, [*args, "--save-params", str(tmp_path / "whole.npy")])
    ck = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "8"]
    _run(2, [*args, *ck, "--stop-after", "21"])    # last checkpoint at step 16
    _run(2, [*args, *ck, "--resume", "--save-params", str(tmp_path / "resumed.npy")])
    assert (tmp_path / "whole.npy").read_bytes() == (tmp_path / "resumed.npy").read_bytes()


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
