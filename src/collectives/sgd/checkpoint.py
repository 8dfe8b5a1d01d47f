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

The data order needs no state of its own: epoch ``e`` is shuffled by ``default_rng((seed, e))``
(:mod:`collectives.sgd.data`), so the step fixes it.

Writing: rank 0 writes a temporary file in the same directory, flushes and fsyncs it,
``os.replace``-s it over ``checkpoint.npz`` and fsyncs the directory, so a job killed at any moment,
even during a write, leaves the previous or the new checkpoint whole. Reading: rank 0 reads and
checks the file and broadcasts a verdict (an error message or the contents), so every rank stops
with the same message or resumes from the same state.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import zipfile
from typing import Any

import numpy as np
from mpi4py import MPI

__all__ = ["FILENAME", "VERSION", "save", "load", "write_atomic", "read"]

FILENAME = "checkpoint.npz"
VERSION = 2  # 2: the compression's state is state.state_dict(), under rank<k>/compression/
_TEMP_PREFIX = ".checkpoint-"


def write_atomic(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` with ``np.savez`` to ``path`` atomically (temp file, fsync, replace)."""
    directory = os.path.dirname(os.path.abspath(path))
    for stale in glob.glob(os.path.join(directory, _TEMP_PREFIX + "*")):
        os.unlink(stale)  # left by a job killed mid-write
    fd, tmp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".tmp", dir=directory)
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
         mine: dict[str, np.ndarray], comm: MPI.Comm) -> None:
    """Collective: gather every rank's ``mine``; rank 0 writes the checkpoint."""
    everyone = comm.gather(mine, root=0)
    if comm.rank != 0:
        return
    arrays = {"meta": _text(json.dumps(meta))}
    arrays.update({f"shared/{k}": v for k, v in shared.items()})
    for r, state in enumerate(everyone):
        arrays.update({f"rank{r}/{k}": v for k, v in state.items()})
    os.makedirs(directory, exist_ok=True)
    write_atomic(os.path.join(directory, FILENAME), arrays)


def _split(arrays: dict[str, np.ndarray], world: int) -> tuple[dict, dict, list[dict]]:
    meta = json.loads(str(arrays["meta"]))
    shared = {k[len("shared/"):]: v for k, v in arrays.items() if k.startswith("shared/")}
    ranks: list[dict] = [{} for _ in range(world)]
    for k, v in arrays.items():
        head, _, name = k.partition("/")
        if head.startswith("rank") and head[4:].isdigit() and int(head[4:]) < world:
            ranks[int(head[4:])][name] = v
    return meta, shared, ranks


def _differences(theirs: str, ours: str) -> str:
    a, b = json.loads(theirs), json.loads(ours)
    diff = [f"{k} {a.get(k)} there, {b.get(k)} here" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]
    return "; ".join(diff) or "fingerprints differ"


def load(directory: str, expect: dict[str, Any], comm: MPI.Comm) -> tuple[dict, dict, dict]:
    """Collective: rank 0 reads and checks the checkpoint; every rank gets ``(meta, shared, mine)``.

    ``expect`` holds ``world`` and ``fingerprint``, which must match. Raises ValueError (the same
    message on every rank) when the file is missing, unreadable, corrupt or from another run.
    """
    verdict, payload = "", None
    if comm.rank == 0:
        path = os.path.join(directory, FILENAME)
        try:
            meta, shared, ranks = _split(read(path), comm.size)
            if meta.get("version") != VERSION:
                raise ValueError(f"checkpoint {path} has format version {meta.get('version')}, "
                                 f"this program reads {VERSION}")
            if meta.get("world") != expect["world"]:
                raise ValueError(f"checkpoint {path} was written by {meta.get('world')} ranks, "
                                 f"this job has {expect['world']}")
            if meta.get("fingerprint") != expect["fingerprint"]:
                raise ValueError(f"checkpoint {path} is from another model or configuration: "
                                 + _differences(meta.get("config", "{}"), expect["config"]))
            payload = (meta, shared, ranks)
        except (ValueError, KeyError, TypeError) as e:
            verdict = str(e) if not isinstance(e, KeyError) else f"checkpoint {path} lacks {e}"
    verdict = comm.bcast(verdict, root=0)
    if verdict:
        raise ValueError(verdict)
    meta, shared, ranks = payload if comm.rank == 0 else (None, None, None)
    meta, shared = comm.bcast((meta, shared), root=0)
    mine = comm.scatter(ranks, root=0)
    return meta, shared, mine
