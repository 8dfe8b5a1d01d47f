"""Checkpoints: one ``.npz`` file per job, written atomically by rank 0, read back on ``--resume``.

Layout of ``CHECKPOINT_DIR/checkpoint.npz`` (``np.savez``; nothing pickled, loaded with
``allow_pickle=False``):

``meta``
    JSON text: format version, step (steps completed), world size, fingerprint of the model and
    training configuration, the per-epoch history so far and the report's counters.
``shared/<name>``
    State equal on every rank, taken from rank 0: parameters, the momentum buffer (synchronous SGD).
``rank<k>/<name>``
    State that differs between ranks, gathered from rank ``k``: with a codec, its
    ``state.state_dict()`` (:class:`collectives.CompressionState`: error-feedback residuals per
    key, the codec's own state such as PowerSGD's warm-start Q or the private generator of QSGD,
    TernGrad, ..., the server-side residuals of the "two_phase" strategy, the step) under
    ``rank<k>/compression/``, the report's counters, and, for local SGD, its momentum buffer.

Sharded runs (``--shard``) add one file per rank, ``shards/step<S>-rank<k>-of<p>.npz``: that
rank's owned slice of the parameters and of the momentum (``own``) and the run's fingerprint.
Each rank writes its own file (atomically, as below) before rank 0 writes ``checkpoint.npz``,
whose step names the files to read, and removes its files of older steps only after that: a job
killed at any moment leaves a committed step whose files are all whole. Reading: after rank 0's
verdict on ``checkpoint.npz``, each rank reads and checks its own file of the committed step
(the same checks, without ``meta``), and the first problem any rank finds is raised on every
rank. The directory needs only be visible to the rank that writes each file.

The data order needs no state of its own: epoch ``e`` is shuffled by ``default_rng((seed, e))``
(:mod:`collectives.sgd.data`), so the step fixes it.

Writing: rank 0 writes a temporary file in the same directory, flushes and fsyncs it,
``os.replace``-s it over ``checkpoint.npz`` and fsyncs the directory, so a job killed at any moment,
even during a write, leaves the previous or the new checkpoint whole. Reading: rank 0 reads the
file, checking every name, size, header, dtype and shape against what this run writes before it
reads the data (:mod:`collectives.sgd.checkpoint_check`: a hostile file cannot make it allocate
without bound or resume from state that does not fit), and broadcasts a verdict (an error message
or the contents), so every rank stops with the same message or resumes from the same state.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import zipfile
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .checkpoint_check import META_MAX_CHARS, Member, read_checked

__all__ = ["FILENAME", "VERSION", "META_MAX_CHARS", "save", "load", "write_atomic", "read",
           "Member", "shard_path", "FINGERPRINT"]

FILENAME = "checkpoint.npz"
VERSION = 2  # 2: the compression's state is state.state_dict(), under rank<k>/compression/
_TEMP_PREFIX = ".checkpoint-"
#: the subdirectory of the ranks' own files (sharded runs)
SHARDS = "shards"
#: the member of a rank's own file holding the run's fingerprint
FINGERPRINT = "fingerprint"


def shard_path(directory: str, step: int, rank: int, world: int) -> str:
    """Where rank ``rank`` of ``world`` keeps its own file of step ``step``."""
    return os.path.join(directory, SHARDS, f"step{step:09d}-rank{rank}-of{world}.npz")


def write_atomic(path: str, arrays: dict[str, np.ndarray], prefix: str = _TEMP_PREFIX) -> None:
    """Write ``arrays`` with ``np.savez`` to ``path`` atomically (temp file, fsync, replace);
    ``prefix``: of the temporary file, whose stale namesakes in the directory are removed first
    (one writer per prefix and directory)."""
    directory = os.path.dirname(os.path.abspath(path))
    for stale in glob.glob(os.path.join(directory, prefix + "*")):
        os.unlink(stale)  # left by a job killed mid-write
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read(path: str) -> dict[str, np.ndarray]:
    """All arrays of the ``.npz`` at ``path``; raises ValueError with a readable reason."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return {name: f[name] for name in f.files}
    except FileNotFoundError:
        raise ValueError(f"no checkpoint at {path}") from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        raise ValueError(f"cannot read checkpoint {path}: {e}") from None


def _text(s: str) -> np.ndarray:
    return np.array(s)


def save(directory: str, meta: dict[str, Any], shared: dict[str, np.ndarray],
         mine: dict[str, np.ndarray], comm: MPI.Comm,
         own: dict[str, np.ndarray] | None = None) -> None:
    """Collective: gather every rank's ``mine``; rank 0 writes the checkpoint. ``own`` (sharded
    runs): what this rank writes in its own file, first (the module docstring)."""
    step, r, p = meta["step"], comm.rank, comm.size
    if own is not None:
        path = shard_path(directory, step, r, p)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, {**own, FINGERPRINT: _text(meta["fingerprint"])},
                     prefix=f".shard-rank{r}-of{p}-")
    everyone = comm.gather(mine, root=0)  # after every rank's own file is written
    if comm.rank == 0:
        arrays = {"meta": _text(json.dumps(meta))}
        arrays.update({f"shared/{k}": v for k, v in shared.items()})
        for k, state in enumerate(everyone):
            arrays.update({f"rank{k}/{name}": v for name, v in state.items()})
        os.makedirs(directory, exist_ok=True)
        write_atomic(os.path.join(directory, FILENAME), arrays)
    if own is not None:
        comm.Barrier()  # step committed: this rank's files of other steps go
        keep = shard_path(directory, step, r, p)
        for old in glob.glob(os.path.join(directory, SHARDS, f"step*-rank{r}-of{p}.npz")):
            if old != keep:
                os.unlink(old)


def _split(arrays: dict[str, np.ndarray], world: int) -> tuple[dict, list[dict]]:
    shared = {k[len("shared/"):]: v for k, v in arrays.items() if k.startswith("shared/")}
    ranks: list[dict] = [{} for _ in range(world)]
    for k, v in arrays.items():
        head, _, name = k.partition("/")
        if head.startswith("rank"):
            ranks[int(head[4:])][name] = v
    return shared, ranks


def load(directory: str, expected: dict[str, Member], expect_meta: dict[str, Any],
         comm: MPI.Comm, check: Callable[[dict, dict, list[dict]], None] | None = None,
         own: dict[str, Member] | None = None) -> tuple[dict, dict, dict]:
    """Collective: rank 0 reads and checks the checkpoint; every rank gets ``(meta, shared, mine)``.

    ``expected``: every member this run writes, by name (:class:`Member`: dtype and shape);
    ``expect_meta``: what ``meta`` must say (:func:`checkpoint_check.check_meta`); ``check``: a
    last check of the values on rank 0 (``check(meta, shared, ranks)`` raises ValueError);
    ``own`` (sharded runs): the members of this rank's own file, which then join ``mine``.
    Nothing is broadcast before the verdict: raises ValueError, the same message on every rank,
    when the file is missing, unreadable, corrupt, hostile or from another run.
    """
    verdict, payload = "", None
    if comm.rank == 0:
        path = os.path.join(directory, FILENAME)
        try:
            meta, arrays = read_checked(path, expected, expect_meta)
            shared, ranks = _split(arrays, comm.size)
            if check is not None:
                check(meta, shared, ranks)
            payload = (meta, shared, ranks)
        except ValueError as e:
            verdict = str(e)
        except Exception as e:  # whatever else a file provokes, every rank must hear of it
            verdict = f"cannot read checkpoint {path}: {type(e).__name__}: {str(e)[:300]}"
    verdict = comm.bcast(verdict, root=0)
    if verdict:
        raise ValueError(verdict)
    meta, shared, ranks = payload if comm.rank == 0 else (None, None, None)
    meta, shared = comm.bcast((meta, shared), root=0)
    mine = comm.scatter(ranks, root=0)
    if own is not None:
        mine.update(_read_own(directory, meta, own, comm))
    return meta, shared, mine


def _read_own(directory: str, meta: dict, own: dict[str, Member],
              comm: MPI.Comm) -> dict[str, np.ndarray]:
    """Collective: this rank's own file of the committed step, checked; the first problem of
    any rank is raised on every rank."""
    path = shard_path(directory, meta["step"], comm.rank, comm.size)
    problem, arrays = "", {}
    try:
        _, arrays = read_checked(path, {**own, FINGERPRINT: Member.text()}, None)
        if str(arrays.pop(FINGERPRINT)) != meta["fingerprint"]:
            problem = f"checkpoint {path} is from another run than {FILENAME}"
    except ValueError as e:
        problem = str(e)
    except Exception as e:  # whatever else a file provokes, every rank must hear of it
        problem = f"cannot read checkpoint {path}: {type(e).__name__}: {str(e)[:300]}"
    problems = [p for p in comm.allgather(problem) if p]
    if problems:
        raise ValueError(problems[0])
    return arrays
