"""The SGD driver in-process on every world size and communicator: tiny runs, replicas in lockstep,
bad arguments stopping every rank alike, and a bitwise resume."""

import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

from collectives.sgd import main, train

TINY = ["--subset", "128", "--epochs", "1", "--hidden", "16", "--batch-size", "4", "--quiet"]


WORLD = MPI.COMM_WORLD


def test_tiny_run_keeps_replicas_identical(comm):
    s = train([*TINY, "--check-replicas"], comm)  # raises if any step's hashes differ
    assert s["world"] == comm.size and s["steps"] == (128 // comm.size) // 4


def test_tiny_compressed_run_keeps_replicas_identical():
    s = train([*TINY, "--check-replicas", "--codec", "topk:ratio=0.1"], WORLD)
    assert s["exchanges"] == s["steps"]


@pytest.mark.parametrize("argv", [
    ["--codec", "bogus"],
    ["--batch-size", "0"],
    ["--codec", "topk:ratio=2"],
    ["--codec", "topk", "--strategy", "summable"],
    ["--batch-size", "200"],
])
def test_bad_arguments_return_2_everywhere(argv):
    comm = WORLD
    codes = comm.allgather(main([*TINY, *argv], comm))
    assert codes == [2] * comm.size


def _shared_dir(comm):
    path = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0)
    return path


def test_corrupt_checkpoint_returns_2_everywhere():
    comm = WORLD
    d = _shared_dir(comm)
    if comm.rank == 0:
        with open(os.path.join(d, "checkpoint.npz"), "wb") as f:
            f.write(b"PK\x03\x04 broken")
    comm.Barrier()
    assert comm.allgather(main([*TINY, "--checkpoint-dir", d, "--resume"], comm)) == [2] * comm.size
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d)


def test_resume_is_bitwise():
    comm = WORLD
    d = _shared_dir(comm)
    args = [*TINY, "--epochs", "2", "--codec", "topk:ratio=0.1", "--checkpoint-dir", d]
    whole = np.load(_params(comm, train, [*args], d, "whole.npy"))
    assert train([*args, "--checkpoint-every", "3", "--stop-after", "4"], comm) is None
    resumed = np.load(_params(comm, train, [*args, "--resume"], d, "resumed.npy"))
    assert np.array_equal(whole, resumed)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(d)


def _params(comm, fn, args, d, name):
    path = os.path.join(d, name)
    fn([*args, "--save-params", path], comm)
    comm.Barrier()
    return path
