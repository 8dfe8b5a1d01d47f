"""Reduction operations: one table from name to the local combine and the MPI operation.

Hand-written algorithms combine two buffers locally with a NumPy ufunc, always as
``ufunc(lower, higher)`` where *lower* holds the contributions of lower ranks. All ops here are
commutative, but IEEE results can still depend on operand order (the sign of ``min(0.0, -0.0)``, the
payload of a NaN), so a fixed order is what keeps results bitwise identical on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

__all__ = ["Op", "OPS", "get_op"]


@dataclass(frozen=True)
class Op:
    """A reduction: its name, local combine, MPI counterpart and whether it divides by p."""

    name: str
    ufunc: np.ufunc
    mpi: MPI.Op
    average: bool = False

    def combine(self, lower: np.ndarray, higher: np.ndarray, out: np.ndarray) -> None:
        """``out = lower (op) higher`` elementwise; ``out`` may alias either operand."""
        self.ufunc(lower, higher, out=out)


#: Every reduction by name. "avg" sums, then divides by the communicator size (floats only).
OPS: dict[str, Op] = {
    "sum": Op("sum", np.add, MPI.SUM),
    "prod": Op("prod", np.multiply, MPI.PROD),
    "min": Op("min", np.minimum, MPI.MIN),
    "max": Op("max", np.maximum, MPI.MAX),
    "avg": Op("avg", np.add, MPI.SUM, average=True),
}

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
    if resolved.average and dtype.kind != "f":
        raise TypeError(f"op 'avg' needs a floating dtype, got {dtype}; use op='sum' and divide")
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
