"""Reduction operations: one table from name to the local combine and the MPI operation.

Hand-written algorithms combine two buffers locally with a NumPy ufunc, always as
``ufunc(lower, higher)`` where *lower* holds the contributions of lower ranks. All ops here are
commutative, but IEEE results can still depend on operand order (the sign of ``min(0.0, -0.0)``, the
payload of a NaN), so a fixed order is what keeps results bitwise identical on every rank.

bfloat16 (``ml_dtypes.bfloat16``) has no MPI type and slow NumPy loops: collectives move it as
16-bit words (``_runtime.arrays.flat`` views it so), and :func:`get_op` gives the *word* form of
each op, which widens both operands to float32 (exact), applies the op and rounds the result to bf16
(nearest even): every pairwise step rounds, as NCCL's bf16 reductions do, and the fixed operand
order keeps results bitwise identical on every rank. ``native`` runs it as a user-defined MPI
operation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
from compress.arrays import is_bfloat16
from compress.bfloat16 import divide_words, on_words
from compress.float16 import combine as half_combine
from mpi4py import MPI

from .observe import OBSERVERS as _OBSERVED

__all__ = ["Op", "OPS", "get_op", "elementwise", "HALF_KERNEL_ELEMENTS"]


_clock = time.perf_counter


def _reduced(observers: tuple, name: str, nbytes: int, t0: float) -> None:
    """Tell the observers of ``reduce`` (``observe.py``: the timeline) of a local
    reduction of ``nbytes`` bytes from ``t0`` to now."""
    t1 = _clock()
    for observe in observers:
        observe(name, nbytes, t0, t1)


@dataclass(frozen=True)
class Op:
    """A reduction: its name, local combine, MPI counterpart and whether it divides by p."""

    name: str
    ufunc: np.ufunc
    mpi: MPI.Op
    average: bool = False
    #: operates on bfloat16 words (uint16 arrays): ``ufunc`` is the word form (see the module)
    words: bool = False

    def combine(self, lower: np.ndarray, higher: np.ndarray, out: np.ndarray) -> None:
        """``out = lower (op) higher`` elementwise; ``out`` may alias either operand. Observed
        at the point ``reduce`` (``observe.py``: the timeline's "reduce" spans)."""
        observers = _OBSERVED.reduce  # off, this test only
        if not observers:
            self.ufunc(lower, higher, out=out)
            return
        t0 = _clock()
        self.ufunc(lower, higher, out=out)
        _reduced(observers, self.name, out.nbytes, t0)

    def divide(self, result: np.ndarray, p: int) -> None:
        """``result /= p`` in place ("avg"), on values or (``words``) on bfloat16 words."""
        if self.words:
            divide_words(result, p)
        else:
            np.divide(result, p, out=result)


#: Every reduction by name. "avg" sums, then divides by the communicator size (floats only).
OPS: dict[str, Op] = {
    "sum": Op("sum", np.add, MPI.SUM),
    "prod": Op("prod", np.multiply, MPI.PROD),
    "min": Op("min", np.minimum, MPI.MIN),
    "max": Op("max", np.maximum, MPI.MAX),
    "avg": Op("avg", np.add, MPI.SUM, average=True),
}

#: the bfloat16 word form of each op (see the module docstring), built on first use
_WORDS: dict[tuple, Op] = {}

#: From this many elements a float16 combine runs a compiled loop with NumPy's bits
#: (:func:`compress.float16.combine`) instead of NumPy's float16 ufunc
HALF_KERNEL_ELEMENTS = 4096


@dataclass(frozen=True)
class HalfOp(Op):
    """An op of :data:`OPS` on float16 arrays: the same op, the same results (NumPy's), a
    compiled loop for long host arrays."""

    def combine(self, lower: np.ndarray, higher: np.ndarray, out: np.ndarray) -> None:
        if (out.size < HALF_KERNEL_ELEMENTS or type(out) is not np.ndarray
                or type(lower) is not np.ndarray or type(higher) is not np.ndarray):
            Op.combine(self, lower, higher, out)
            return
        observers = _OBSERVED.reduce
        t0 = _clock() if observers else 0.0
        half_combine(self.ufunc, lower, higher, out)
        if observers:
            _reduced(observers, self.name, out.nbytes, t0)


_HALF: dict[str, Op] = {}


def _on_half(op: Op) -> Op:
    """``op`` for float16 arrays (:class:`HalfOp`), if it is one of :data:`OPS`."""
    known = OPS.get(op.name)
    if known is None or op.ufunc is not known.ufunc:
        return op
    found = _HALF.get(op.name)
    if found is None:
        found = _HALF[op.name] = HalfOp(op.name, op.ufunc, op.mpi, op.average)
    return found


def _on_words(op: Op) -> Op:
    if op.words:
        return op
    found = _WORDS.get((op.name, op.ufunc))
    if found is None:
        ufunc = op.ufunc

        def combine(a, b, out=None):
            on_words(ufunc, a, b, out)

        found = _WORDS[(op.name, op.ufunc)] = replace(op, ufunc=combine, words=True)
    return found


_BY_MPI = [(MPI.SUM, "sum"), (MPI.PROD, "prod"), (MPI.MIN, "min"), (MPI.MAX, "max")]


def get_op(op: str | MPI.Op | Op, dtype: np.dtype) -> Op:
    """Resolve ``op`` (a name, an ``MPI.SUM``-style object or an :class:`Op`) for ``dtype``.

    Raises
    ------
    ValueError
        Unknown op; the message lists the valid names.
    TypeError
        "avg" on an integer dtype (an integer mean would silently truncate).
    """
    resolved = OPS.get(op) if type(op) is str else None  # the per-call path: a name
    if resolved is None:
        resolved = _resolve(op)
    if dtype.isbuiltin != 1 and is_bfloat16(dtype):
        return _on_words(resolved)
    if resolved.average and dtype.kind != "f":
        raise TypeError(f"op 'avg' needs a floating dtype, got {dtype}; use op='sum' and divide")
    if dtype.char == "e":
        return _on_half(resolved)
    return resolved


def _resolve(op: object) -> Op:
    if isinstance(op, Op):
        return op
    if isinstance(op, MPI.Op):
        name = next((n for o, n in _BY_MPI if o == op), None)
        if name is None:
            raise ValueError(f"unsupported MPI op {op!r}; supported: MPI.SUM, MPI.PROD, MPI.MIN, "
                             f"MPI.MAX, or the names {', '.join(OPS)}")
        return OPS[name]
    raise ValueError(f"unknown op {op!r}; valid ops: {', '.join(OPS)} "
                     f"(or MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX)")


def elementwise(op: Op) -> bool:
    """Whether ``op`` is one of :data:`OPS` as it is (or its "avg"), on the array's own values:
    what the shared-memory kernels compute. Not so for bfloat16 words or a strategy's own
    addition (a codec's ``summable_add``), which need the message-based algorithms."""
    known = OPS.get(op.name)
    return not op.words and known is not None and op.ufunc is known.ufunc
