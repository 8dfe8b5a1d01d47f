"""Plain gather-then-reduce references and the checks every multi-rank test applies."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

import collectives

DTYPES = [np.dtype(d) for d in collectives.SUPPORTED_DTYPES]
OPS = list(collectives.OPS)
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "avg": np.add}


def for_algorithm(options: collectives.Options, algorithm: str) -> collectives.Options:
    """``options`` for ``algorithm``: "shm" needs one node, so it keeps the real one (tests cut
    the world into emulated nodes for "hierarchical")."""
    return dataclasses.replace(options, node_size=None) if algorithm == "shm" else options


def segmented(options: collectives.Options, count: int, itemsize: int,
              p: int) -> collectives.Options:
    """``options`` with segments of ``options.segment_bytes`` or more, so that a block of
    ``count / p`` elements is cut into at most about 4, and shm's slots hold a quarter of the
    vector at least: the multi-segment path on every count (a 1001-element ring at p = 8 sent
    600 messages a call with 24-byte segments, most of the suite's time on 2 cores)."""
    block = -(-count * itemsize // max(p, 1))
    shm = options.shm_segment_bytes  # shm's rounds: the node's window, a few per call too
    return dataclasses.replace(
        options, segment_bytes=max(options.segment_bytes, -(-block // 4)),
        shm_segment_bytes=None if shm is None else max(shm, -(-count * itemsize // 4)))


#: from this many ranks on (more ranks than the 2-core CI machine has cores, 2.5x and up) the
#: sweeps cover dtypes and ops by pairs instead of the full product (see :func:`sweep_cases`)
COVERING_FROM = 5


def sweep_cases(p: int, dtypes=None, ops=None,
                covering: bool | None = None) -> list[tuple[int, np.dtype, str, bool]]:
    """``(count, dtype, op, inplace)`` of an allreduce sweep at ``p`` ranks: every count of
    :func:`counts_for`; below :data:`COVERING_FROM` ranks every dtype with every op (avg on
    floats only), in place and not; from there on a covering design: floats with every op,
    integers with "sum" and one more op in turn (so that every op meets signed and unsigned
    integers of several widths), in place on alternate cases (each pair is still seen both
    ways across the counts). The algorithms move bytes and call one combine per dtype and op,
    which the small world sizes sweep in full.
    ``covering``: the covering design at any ``p`` (True) or never (False)."""
    covering = p >= COVERING_FROM if covering is None else covering
    dtypes = DTYPES if dtypes is None else dtypes
    ops = OPS if ops is None else ops
    pairs = [(d, op) for d in dtypes for op in ops if op != "avg" or d.kind == "f"]
    if covering:
        others = [op for op in ops if op not in ("sum", "avg")]
        ints = [d for d in dtypes if d.kind != "f"]
        pairs = [(d, op) for d, op in pairs if d.kind == "f"]
        for i, d in enumerate(ints):
            pairs += [(d, op) for op in ops if op == "sum"]
            if others:
                pairs.append((d, others[i % len(others)]))
    cases = []
    for k, count in enumerate(counts_for(p)):
        for j, (dtype, op) in enumerate(pairs):
            for inplace in (False, True):
                if not covering or (k + j) % 2 == int(inplace):
                    cases.append((count, dtype, op, inplace))
    return cases


def counts_for(p: int) -> list[int]:
    """The counts every sweep covers: 0, 1, p-1, p+1 and a large odd one."""
    return sorted({0, 1, max(p - 1, 0), p + 1, 1001})


def make_input(count: int, dtype: np.dtype, op: str, rank: int, seed: int = 0) -> np.ndarray:
    """Deterministic per-rank test data suited to ``op`` (no integer overflow for sum/prod)."""
    rng = np.random.default_rng([seed, rank, count, dtype.num, OPS.index(op)])
    if dtype.kind == "f":
        if op == "prod":
            x = rng.uniform(0.5, 1.5, count)
        else:
            x = rng.standard_normal(count)
            x[:: 7] = -0.0 if op in ("min", "max") else x[:: 7]
    elif op == "prod":
        x = rng.choice([1, 2] if dtype.kind == "u" else [-1, 1, 2], count, p=None)
        x[rng.random(count) < 0.8] = 1
    else:
        lo = 0 if dtype.kind == "u" else -9
        x = rng.integers(lo, 10, count)
    return x.astype(dtype)


def gather_all(x: np.ndarray, comm: MPI.Comm) -> np.ndarray:
    """Every rank's ``x`` as the rows of one (p, n) array, by a plain MPI_Allgather of bytes."""
    rows = np.empty((comm.size, x.size), dtype=x.dtype)
    comm.Allgather([np.ascontiguousarray(x).reshape(-1), MPI.BYTE], [rows, MPI.BYTE])
    return rows


def _reduce_rows(rows: np.ndarray, op: str) -> np.ndarray:
    """The rows (one per rank) reduced in rank order in NumPy (float64 for floats), divided by
    the number of rows for avg."""
    acc = rows[0].astype(np.float64) if rows.dtype.kind == "f" else rows[0].copy()
    for row in rows[1:]:
        acc = UFUNCS[op](acc, row.astype(acc.dtype))
    if op == "avg":
        acc = acc / rows.shape[0]
    return acc


def reference_allreduce(x: np.ndarray, op: str, comm: MPI.Comm) -> np.ndarray:
    """Gather everything, reduce in rank order in NumPy (float64 for floats), divide for avg."""
    return _reduce_rows(gather_all(x, comm), op).reshape(x.shape)


def _gather_pair(x: np.ndarray, y: np.ndarray,
                 comm: MPI.Comm) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's ``x`` (rows of x's dtype) and the bytes of its ``y`` (rows of uint8), in one
    MPI_Allgather: on a machine with more ranks than cores each collective costs a round of the
    scheduler, and the sweeps check thousands of results."""
    xb = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    yb = np.ascontiguousarray(y).reshape(-1).view(np.uint8)
    rows = gather_all(np.concatenate([xb, yb]), comm)
    return rows[:, :xb.size].copy().view(x.dtype), rows[:, xb.size:]


def assert_close(y: np.ndarray, x: np.ndarray, op: str, comm: MPI.Comm, what: str,
                 identical: bool = False) -> None:
    """``y`` equals the reference exactly (integers, min, max) or within rounding (floats);
    ``identical``: and its bytes are the same on every rank (:func:`assert_identical_everywhere`,
    from the same gather)."""
    assert y.shape == x.shape and y.dtype == x.dtype, (what, y.shape, y.dtype)
    if identical:
        rows, ybytes = _gather_pair(x, y, comm)
    else:
        rows, ybytes = gather_all(x, comm), None
    ref = _reduce_rows(rows, op).reshape(x.shape)
    if x.dtype.kind != "f" or op in ("min", "max"):
        assert np.array_equal(y, ref.astype(x.dtype)), f"{what}: {y!r} != {ref!r}"
    else:
        eps = float(np.finfo(x.dtype).eps)
        if op == "prod":
            bound = 2 * comm.size * eps * np.abs(ref)
        else:
            bound = 2 * comm.size * eps * np.abs(rows.astype(np.float64)).sum(axis=0).reshape(x.shape)
            bound = bound / (comm.size if op == "avg" else 1)
        err = np.abs(y.astype(np.float64) - ref)
        assert (err <= bound + np.finfo(x.dtype).tiny).all(), \
            f"{what}: max error {err.max()} exceeds bound at {np.argmax(err - bound)}"
    if identical:
        assert (ybytes == ybytes[0]).all(), f"{what}: results differ across ranks"


def assert_identical_everywhere(y: np.ndarray, comm: MPI.Comm, what: str) -> None:
    """The bytes of ``y`` are the same on every rank."""
    rows = gather_all(y.reshape(-1).view(np.uint8), comm)
    assert (rows == rows[0]).all(), f"{what}: results differ across ranks"


#: the codec settings the compressed tests share: the same on every rank (``SHARED_CODEC``) and
#: per rank (``PRIVATE_SEEDED`` codecs draw from a seed of their rank's)
SHARED_CODEC = {"randomk": dict(ratio=0.2, seed=1), "powersgd": dict(rank=2, seed=3)}
PRIVATE_SEEDED = {"qsgd", "terngrad", "natural", "dgc"}


def make_codec(name: str, rank: int, params: dict) -> object:
    """The codec ``name`` (with ``params[name]``) the same on every rank, except private seeds,
    which differ per rank."""
    import compress

    kw = dict(SHARED_CODEC.get(name, {}), **params.get(name, {}))
    if name in PRIVATE_SEEDED:
        kw["seed"] = 1000 + rank
    return compress.get(name, **kw)


def codec_data(n: int, rank: int, salt: int = 0) -> np.ndarray:
    """``n`` float32 values of ``rank`` (standard normal, seeded by rank, n and salt)."""
    return np.random.default_rng([rank, n, salt]).standard_normal(n).astype(np.float32)


def trainer(argv: list[str], comm: MPI.Comm):
    """The SGD driver's trainer of ``argv`` on ``comm`` (:class:`~collectives.sgd.driver.Trainer`,
    or ``PipelinedTrainer`` for a run on a mesh), made as ``train()`` makes it (its clock started
    at 0)."""
    from collectives.sgd import datasets
    from collectives.sgd.cli import parse
    from collectives.sgd.driver import PipelinedTrainer, Trainer

    pre = parse(argv, comm.size, 10**12)
    ds = datasets.load(pre.args.dataset, pre.args.subset)
    cfg = parse(argv, comm.size, len(ds.y_train))
    t = (PipelinedTrainer if cfg.mesh else Trainer)(cfg, ds, comm)
    t.t_start = 0.0
    return t


def one_process(t) -> np.ndarray:
    """The flat parameters of the model of the trainer ``t`` trained in one process for
    ``t.step`` steps, each on the step's global batch (its data-parallel replicas' batches
    together), with the run's optimizer and learning-rate schedule."""
    from collectives.sgd import data
    from collectives.sgd.model import MLP
    from collectives.sgd.optim import SGD, Schedule

    a, ds = t.args, t.ds
    replicas = getattr(t, "replicas", t.world)
    model = MLP(t.sizes, seed=a.seed)
    opt = SGD(model.params.flat, a.momentum, a.weight_decay)
    sched = Schedule(a.lr, a.batch_size * replicas, int(round(a.warmup_epochs * t.spe)), t.total)
    B = a.batch_size
    for step in range(t.step):
        epoch, i = divmod(step, t.spe)
        b = np.concatenate([data.shard(len(ds.y_train), replicas, r, a.seed, epoch)
                            [i * B:(i + 1) * B] for r in range(replicas)])
        model.loss_and_grad(ds.x_train[b], ds.y_train[b])
        opt.step(model.grads.flat, sched(step))
    return model.params.flat


@contextmanager
def shared_dir(comm: MPI.Comm):
    """A temporary folder that every rank of ``comm`` names (made on rank 0, which shares this
    machine's file system with the others), removed by rank 0 once every rank has left the
    block."""
    d = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0)
    try:
        yield d
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(d, ignore_errors=True)
