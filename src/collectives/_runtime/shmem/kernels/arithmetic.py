"""The reduction arithmetic: :func:`fold` and the element operations it is built from (private).

:func:`fold` reduces one segment from p operands in one pass over memory, in blocks of
:data:`BLOCK` elements that stay in L1 while every operand is combined into them, then stored to
the other destinations (a destination may be one of the operands, in place). Operands combine
left to right, i.e. in rank order, with NumPy's semantics: wrapping integers, min/max keeping
the first operand only when it is strictly smaller/larger or NaN (``np.minimum``'s choice:
``min(0.0, -0.0)`` is ``-0.0``, NaN propagates), float16 computed in float32 and rounded to
float16 after every operation as NumPy does, with NumPy's float16 loops' own choices (the first
operand when it is <= (>=) the second, so ``min(-0.0, 0.0)`` is ``-0.0``; a NaN second operand
of a sum or product is the result).

Each element is widened to the type the reduction computes in as it is loaded (:func:`_widen`)
and narrowed back as it is stored (:func:`_narrow`): the identity for native formats, the
float16 conversions for :data:`~.memory.FLOAT16` data.
"""

from __future__ import annotations

from compress.float16 import conversions
from numba import carray, njit
from numba.extending import overload

from .. import layout as L
from . import NJIT
from .memory import is_float16, pointer

__all__ = ["BLOCK", "fold"]

#: Elements combined at a time (``layout.FOLD_BLOCK``).
BLOCK = L.FOLD_BLOCK

_SUM, _PROD, _MIN, _MAX = L.OPCODES["sum"], L.OPCODES["prod"], L.OPCODES["min"], L.OPCODES["max"]
_half_to_float, _float_to_half = conversions()


def _widen(value, token):  # pragma: no cover - replaced by the overload below
    """A stored element as the type the reduction computes in."""


def _narrow(value, token):  # pragma: no cover - replaced by the overload below
    """A computed value as the stored element."""


@overload(_widen, inline="always")
def _widen_impl(value, token):
    if is_float16(token):
        return lambda value, token: _half_to_float(value)
    return lambda value, token: value


@overload(_narrow, inline="always")
def _narrow_impl(value, token):
    if is_float16(token):
        return lambda value, token: _float_to_half(value)
    return lambda value, token: value


@njit(inline="always")
def _combine(op, a, b):  # pragma: no cover - compiled
    # ``op`` is the same for a whole loop, so LLVM unswitches it: one vector loop per op
    if op == _SUM:
        return a + b
    if op == _PROD:
        return a * b
    if op == _MIN:
        return a if (a < b or a != a) else b
    return a if (a > b or a != a) else b


@njit(inline="always")
def _combine_half(op, a, b):  # pragma: no cover - compiled
    # NumPy's float16 loops (on widened values): a NaN second operand of a sum or product is
    # the result even when the first is NaN too, where x86 would keep the first's; minimum and
    # maximum keep the first operand when it is <= (>=) the second, so min(-0.0, 0.0) is -0.0
    if op == _SUM:
        return b + b if b != b else a + b
    if op == _PROD:
        return b * b if b != b else a * b
    if op == _MIN:
        return a if (a <= b or a != a) else b
    return a if (a >= b or a != a) else b


def _combine_as(op, a, b, token):  # pragma: no cover - replaced by the overload below
    """``a op b`` with NumPy's rules for the stored type ``token`` stands for."""


@overload(_combine_as)
def _combine_as_impl(op, a, b, token):
    if is_float16(token):
        return lambda op, a, b, token: _combine_half(op, a, b)
    return lambda op, a, b, token: _combine(op, a, b)


@njit(**NJIT)
def fold(op, token, srcs, nsrc, dsts, ndst, count, scratch):  # pragma: no cover - compiled
    """``dsts[k][i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i]`` for every k < ndst.

    ``srcs``/``dsts`` hold addresses of ``count`` elements each. A destination may be one of the
    sources (in place): the first destination accumulates the result unless it is a source other
    than the first, in which case each block is combined in ``scratch`` (the address of ``BLOCK``
    elements, which stay in L1) and then stored.
    """
    if ndst == 0 or count == 0:
        return
    isz = token.itemsize
    in_place = False
    for q in range(1, nsrc):
        in_place = in_place or srcs[q] == dsts[0]
    for lo in range(0, count, BLOCK):
        c = min(BLOCK, count - lo)
        at = lo * isz
        acc = carray(pointer(scratch if in_place else dsts[0] + at, token), c)
        a = carray(pointer(srcs[0] + at, token), c)
        if nsrc == 1:
            acc = a
        else:
            b = carray(pointer(srcs[1] + at, token), c)
            for i in range(c):
                acc[i] = _narrow(_combine_as(op, _widen(a[i], token), _widen(b[i], token), token),
                                 token)
            for q in range(2, nsrc):
                s = carray(pointer(srcs[q] + at, token), c)
                for i in range(c):
                    acc[i] = _narrow(_combine_as(op, _widen(acc[i], token), _widen(s[i], token),
                                                 token), token)
        for k in range(ndst):
            d = carray(pointer(dsts[k] + at, token), c)
            if d.ctypes.data != acc.ctypes.data:
                for i in range(c):
                    d[i] = acc[i]

