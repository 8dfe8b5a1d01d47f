"""float16 arithmetic with NumPy's bits, compiled (host arrays).

NumPy's float16 ufuncs convert every element to float32 and back in software, element by
element: an addition of two float16 arrays runs an order of magnitude slower than one of float32
arrays. :func:`combine` runs the same four operations in a compiled loop
(:func:`compress._kernels.floats.combine_half`, the processor's float16 conversions) with the same
bits as NumPy's ufunc, NaN payloads, signalling NaNs and signed zeros included
(``tests/test_units.py`` checks every pair of special values). ``collectives.ops`` combines long
float16 arrays with it. Numba is imported at the first call, not with this module.
"""

from __future__ import annotations

import numpy as np

__all__ = ["UFUNCS", "combine", "conversions"]

#: The ufuncs :func:`combine` computes, and their names in the kernel's table.
UFUNCS = {np.add: "sum", np.multiply: "prod", np.minimum: "min", np.maximum: "max"}
_KERNEL: list = []


def combine(ufunc: np.ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``ufunc(a, b, out=out)`` for one of :data:`UFUNCS` on 1-D float16 NumPy arrays of one
    size, with NumPy's bits; ``out`` may be ``a`` or ``b``."""
    if not _KERNEL:
        from ._kernels.floats import HALF_OPS, combine_half

        _KERNEL.append((combine_half, HALF_OPS))
    kernel, codes = _KERNEL[0]
    kernel(codes[UFUNCS[ufunc]], a.view(np.uint16), b.view(np.uint16), out.view(np.uint16))


def conversions() -> tuple:
    """``(half_to_float, float_to_half)``: the Numba intrinsics of the processor's float16
    conversions (a uint16 word to float32, exact; float32 to the nearest word, ties to even, as
    NumPy rounds), for other Numba kernels to call. Imports Numba."""
    from ._kernels.floats import float_to_half, half_to_float

    return half_to_float, float_to_half
