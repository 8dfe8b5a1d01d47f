"""Compile the Numba kernels of the common call paths ahead, into Numba's cache.

A process's first call of a path compiles its kernels unless Numba's cache holds them (seconds:
docs/benchmarks/first-call.md). ``python -m collectives warmup`` runs each
path of :data:`PATHS` once per dtype, in one process without MPI peers, on a few elements, so that
every kernel the path's first call needs is compiled and written to the cache (``NUMBA_CACHE_DIR``
if set, else ``__pycache__`` next to the kernels' sources): later processes load it instead.

- ``allreduce``: the shm round driver (``run_rounds``, what ``algorithm="auto"`` runs on one
  node), through a one-rank team on ``COMM_SELF``: the same argument types as any team's call,
  and its byte signatures, which the shm barrier and alltoall run (whatever the dtype);
  for float16 also the compiled reduction of the message-based algorithms
  (:class:`collectives.ops.HalfOp`, from ``HALF_KERNEL_ELEMENTS`` elements);
- ``compressed``: ``compressed_allreduce`` with top-k and error feedback and the sparse
  strategy's merges (:func:`collectives.compressed.precompile.topk_with_feedback`); for float32 also
  the fp16 codec's encode and decode.

The kernels take any op in one compile (the op is an argument); each dtype is a compile of its own.

:func:`preload` runs the same paths in the calling process at a moment of its choosing (start-up,
while the data loads), so that its first call pays no more than a warm one: what a process pays
once even with a warm cache, Numba's import and the loading of each kernel from the cache
(docs/benchmarks/first-call.md), is paid there instead.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import numpy as np
from .._runtime.context import Context

__all__ = ["PATHS", "DTYPES", "warmup", "preload", "kernel_stats"]

#: Dtypes warmed by default.
DTYPES = ("float32", "float64")


def _allreduce(dtype: np.dtype) -> None:
    from mpi4py import MPI

    from .._runtime.shmem import layout
    from .._runtime.shmem.team import Team

    team = Team(MPI.COMM_SELF, None)
    try:
        x = np.arange(8, dtype=dtype)
        out = np.empty_like(x)
        team.run(x, out, layout.OPCODES["sum"], layout.REPLICATED, 1, None)
        # the byte kernel of the shm barrier and alltoall (any dtype travels as uint8 views),
        # for a writeable input and a read-only one
        token = np.zeros(8, np.uint8)
        team.run(token, token, layout.OPCODES["max"], layout.REPLICATED, 1, None)
        fixed = np.zeros(8, np.uint8)
        fixed.flags.writeable = False
        team.run(fixed, token, layout.OPCODES["max"], layout.REPLICATED, 1, None)
    finally:
        team.free()
    if dtype == np.float16:
        from ..ops import HALF_KERNEL_ELEMENTS, get_op

        y = np.ones(HALF_KERNEL_ELEMENTS, dtype)
        get_op("sum", dtype).combine(y, y, y)  # one compile serves every op


def _compressed(dtype: np.dtype) -> None:
    from ..compressed.precompile import topk_with_feedback

    topk_with_feedback(dtype)
    if dtype == np.float32:  # the fp16 codec (Horovod's Compression.fp16): encode and decode
        import compress

        codec = compress.from_spec("fp16")
        codec.decode(codec.encode(np.linspace(-1, 1, 8, dtype=dtype)))


#: What ``warmup`` can compile, by name.
PATHS: dict[str, Callable[[np.dtype], None]] = {"allreduce": _allreduce, "compressed": _compressed}


def kernel_stats() -> tuple[int, int]:
    """(kernels compiled, kernels loaded from the cache) so far in this process, over the
    ``@njit`` kernels of ``collectives`` and ``compress``."""
    if "numba" not in sys.modules:
        return 0, 0
    from numba.core.registry import CPUDispatcher

    compiled = loaded = 0
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(("collectives.", "compress.")):
            continue
        for obj in list(vars(mod).values()):
            if isinstance(obj, CPUDispatcher):
                compiled += sum(obj.stats.cache_misses.values())
                loaded += sum(obj.stats.cache_hits.values())
    return compiled, loaded


def warmup(dtypes: list[str] | tuple[str, ...] = DTYPES,
           paths: list[str] | tuple[str, ...] = tuple(PATHS),
           say: Callable[[str], None] = print) -> list[dict]:
    """Run ``paths`` for ``dtypes``; ``say`` one line per (path, dtype); return the rows."""
    for name in paths:
        if name not in PATHS:
            raise ValueError(f"unknown path {name!r}; valid: {', '.join(PATHS)}")
    kinds = [np.dtype(d) for d in dtypes]
    from numba.core import config

    say(f"warming Numba's cache in {config.CACHE_DIR or '__pycache__ next to the sources'}")
    rows = []
    for name in paths:
        for dtype in kinds:
            before = kernel_stats()
            t = time.perf_counter()
            PATHS[name](dtype)
            seconds = time.perf_counter() - t
            after = kernel_stats()
            row = {"path": name, "dtype": str(dtype), "s": seconds,
                   "compiled": after[0] - before[0], "loaded": after[1] - before[1]}
            rows.append(row)
            say(f"{name:<11}{str(dtype):<9}{seconds:7.2f} s  {row['compiled']} kernels "
                f"compiled, {row['loaded']} loaded from the cache")
    return rows


def preload(dtypes: list[str] | tuple[str, ...] = ("float32",),
            paths: list[str] | tuple[str, ...] = tuple(PATHS), comm: Any = None,
            options: Any = None) -> list[dict]:
    """Import Numba and load the kernels of ``paths`` for ``dtypes`` into this process (from
    Numba's cache, or compiled where it does not hold them), so that the first call of those
    paths runs as fast as a later one. Without ``comm`` it is local: no other rank takes part,
    and it may be called at any time, on any rank. Returns one row per path and dtype (as
    :func:`warmup`: seconds, kernels compiled, kernels loaded).

    With ``comm`` (an intracommunicator) it is collective over ``comm``, like a call: it also
    sets ``comm`` up as the first call on it would, under ``options`` (default: from the
    environment) — the library's private duplicate, the failure guard, how ``algorithm="auto"``
    chooses, and the shared-memory team that "auto" runs on (on one node; across nodes,
    hierarchical's), with this rank's part of its window written once, so that no later call
    pays its first touch — then runs one allreduce of one element per dtype. What is left to a
    first call is the first touch of the arrays it makes (an out-of-place result).

    Raises
    ------
    ValueError
        A path that is not in :data:`PATHS`.
    TypeError
        A dtype NumPy does not know (``np.dtype``'s error); a ``comm`` that is not an
        intracommunicator.
    """
    if comm is not None:
        from .._runtime.validate import check_comm
        from ..options import Options

        check_comm("preload", comm)
        if options is not None and not isinstance(options, Options):
            raise TypeError(f"preload: options must be a collectives.Options, got "
                            f"{type(options).__name__}")
    rows = warmup(dtypes, paths, say=lambda line: None)
    if comm is not None and comm.size > 1:
        _set_up(comm, options, [np.dtype(d) for d in dtypes])
    return rows


def _set_up(comm: Any, options: Any, kinds: list[np.dtype]) -> None:
    """What the first call on ``comm`` sets up, as call number 1 of its guard (so that an error
    on any rank is one on every rank), then one small allreduce per dtype (collective)."""
    from .._runtime.context import context
    from .._runtime.abort_mode import runner
    from ..api import allreduce
    from ..options import Options

    opts = Options.from_env() if options is None else options  # (preload checked its type)
    ctx = context(comm, opts)
    runner(ctx, opts).run("preload", _prepare, ctx, opts, timeout=opts.timeout)
    for dtype in kinds:
        allreduce(np.zeros(1, dtype), comm=comm, options=options)


def _prepare(ctx: Context, opts: Any) -> None:
    """What "auto" may run on ``ctx`` at any size: on one node the shm team; across nodes with
    several ranks on a node, hierarchical's layout (the cost model may pick it)."""
    from ..algorithms import auto, hierarchical, shm

    nodes = auto.selector(ctx, opts.node_size).nodes
    if len(nodes) == 1:
        shm.prepare(ctx, opts)
    elif max(nodes) > 1:
        hierarchical.prepare(ctx, opts)
