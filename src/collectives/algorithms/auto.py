"""Auto: pick an algorithm from the message size and the number of ranks.

Two sources, in order:

1. **A per-machine tuning file** (``collectives-tune`` writes it; where it is looked for and its
   format: :mod:`collectives.tuning.tuning_file`). For a world size it covers, the first rule whose
   ``max_bytes`` is >= the message size names the algorithm.
2. **The built-in rule** otherwise (measured on a 2-core machine with the MPICH wheel; see
   docs/algorithms.md): "native" for ``count < pof2`` or at most ``SMALL_BYTES`` (64 KiB) - there
   latency is all there is, and every hand-written step pays a few microseconds of Python that
   MPI's C path does not; "rabenseifner" above (2 lg p messages and the bandwidth-optimal
   volume; 0.43-1.04x native's time from 1 MiB to 4 MiB at p = 2, 4, 8). When every rank shares
   one node, "shm" at every size from ``SHM_BYTES`` (0) up instead: with no messages at all it
   took 0.87-1.10x native's time at 8 B and 0.03-0.71x from 256 KiB to 64 MiB, at p = 2 and 4,
   MPICH and Open MPI, on a loaded machine (docs/benchmarks.md). A tuned rule naming "shm" on
   a communicator that spans nodes falls back to this rule. The fitted cost model
   (:mod:`collectives.tuning.cost_model`) did not do clearly better than this rule on that
   machine: it cannot see the per-call Python overhead that decides small messages there, and
   picks recursive doubling where native is faster (docs/benchmarks.md), so this rule stays the
   fallback.

Every rank must pick the same algorithm. Only rank 0 reads the tuning file, at the first "auto"
call on a communicator, and broadcasts its rules once (on the private duplicate, cached in the
communicator's context); later calls use the cached rules with no extra communication. If the
file is malformed, rank 0 warns once (``RuntimeWarning``) and every rank uses the built-in rule.
"""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np
from mpi4py import MPI

from .. import tuning
from .._context import Context
from ..ops import Op
from ..options import Options
from . import shm
from .flat import FLAT
from .pof2 import pof2_of

__all__ = ["choose", "builtin_choice", "comm_rules", "resolve", "allreduce", "SMALL_BYTES",
           "SHM_BYTES"]

SMALL_BYTES = 64 << 10
SHM_BYTES = 0
_RULES_KEY = "auto-tuning-rules"


def builtin_choice(nbytes: int, count: int, p: int, one_node: bool = False) -> str:
    """The built-in rule: "shm" from ``SHM_BYTES`` on one node, else "native" up to 64 KiB or
    below ``pof2`` elements, else Rabenseifner."""
    if one_node and nbytes >= SHM_BYTES:
        return "shm"
    if count < pof2_of(p) or nbytes <= SMALL_BYTES:
        return "native"
    return "rabenseifner"


def choose(nbytes: int, count: int, p: int, rules: tuning.Rules | None = None,
           one_node: bool = False) -> str:
    """The algorithm "auto" runs for ``count`` elements (``nbytes`` bytes) on ``p`` ranks.

    ``rules``: tuned rules for ``p`` (see :mod:`collectives.tuning`); None: the built-in rule.
    ``one_node``: whether every rank shares a node (else "shm" is never chosen).
    """
    if rules is None:
        return builtin_choice(nbytes, count, p, one_node)
    for limit, name in rules:
        if nbytes <= limit:
            return name if one_node or name != "shm" else builtin_choice(nbytes, count, p)
    raise ValueError("tuning rules must end with an unlimited rule")


def _agree(comm: MPI.Comm) -> tuning.Rules | None:
    rules, problem = None, None
    if comm.rank == 0:
        try:
            rules = tuning.rules_for(comm.size)
        except tuning.TuningFileError as exc:
            problem = str(exc)
    rules, problem = comm.bcast((rules, problem), root=0)
    if problem and comm.rank == 0:
        warnings.warn(f"ignoring the tuning file: {problem}; algorithm='auto' uses its "
                      "built-in rule", RuntimeWarning, stacklevel=2)
    return rules


def comm_rules(ctx: Context) -> tuning.Rules | None:
    """Rank 0's tuned rules for this communicator, broadcast once at first use, then cached."""
    return ctx.cached(_RULES_KEY, _agree)


def resolve(buf: np.ndarray, ctx: Context, opts: Options) -> Callable[..., None]:
    """The algorithm function "auto" runs for ``buf`` on ``ctx`` (collective at the first call
    on a communicator; then cached). Plans and repeated calls decide once through this, so they
    run what :func:`allreduce` runs."""
    rules = ctx.cached(_RULES_KEY, _agree)  # comm_rules, inlined: this is the per-call path
    name = choose(buf.nbytes, buf.size, ctx.comm.size, rules, shm.on_one_node(ctx, opts))
    return shm.allreduce if name == "shm" else FLAT[name]


def allreduce(src: np.ndarray, buf: np.ndarray, op: Op, ctx: Context, opts: Options) -> None:
    resolve(buf, ctx, opts)(src, buf, op, ctx, opts)
