"""The dtype an error-feedback residual is kept in: ``residual_dtype=`` of ``ErrorFeedback``.

Error feedback keeps, per tensor, the residual ``e`` the codec did not send. Kept in the
tensor's own dtype (float32 for a float32 gradient), it costs as much memory as the gradient
itself; a sharded trainer, whose gradient is ``1/p`` of the model, pays a full gradient's size
again per rank (one residual per destination block). A narrower residual halves that:

``"float32"``
    Four bytes per element; for a float32 tensor, the residual as it is (no rounding).
``"float16"``
    Two bytes (binary16, NumPy's ``float16``): 11 significant bits, so each step's new residual
    is rounded with a relative error of at most ``2**-11`` (:attr:`ResidualFormat.unit_roundoff`);
    magnitudes under ``2**-14`` lose bits (subnormals, an absolute error of at most ``2**-25``)
    and an element beyond 65504 is kept as ±65504 (saturated, not infinity, which would poison
    every later step).
``"bfloat16"``
    Two bytes (bfloat16, kept as the ``uint16`` words of :mod:`compress.bfloat16`: NumPy has no
    such dtype without ``ml_dtypes``): float32's range, 8 significant bits, a relative error of
    at most ``2**-8`` per step (a float64 tensor's values are rounded through float32, so at
    most ``2**-8 + 2**-24``).

So with a narrow residual the sum over steps of what was sent plus the residual equals the sum of
the inputs up to the roundings of the residuals kept: ``|sum_t (x_t) - sum_t (sent_t) - e_T| <=
sum_t u |e_t|`` (``u`` the unit roundoff; plus ``2**-25`` per element and step in float16's
subnormal range): the error feedback still carries what was not sent, to the residual dtype's
rounding (``tests/compress/test_residual_dtype.py``).

A format narrows the compensated values (float32) into the stored words and widens them back
(exact) before the next step adds them; on the host through the Numba kernels of the codecs
(F16C's conversion for float16, round to nearest even for both).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._backends import HOST, count_nonfinite
from .arrays import is_device, namespace

__all__ = ["ResidualFormat", "RESIDUAL_DTYPES", "residual_format"]

_F16_MAX = 65504.0


@dataclass(frozen=True)
class ResidualFormat:
    """How a residual is stored: ``storage`` is the stored array's dtype (uint16 words for
    bfloat16), ``unit_roundoff`` the largest relative rounding error of one narrowing (0 for
    float32 from a float32 tensor)."""

    name: str
    storage: np.dtype
    unit_roundoff: float

    def narrows(self, dtype: np.dtype) -> bool:
        """Whether a residual of a ``dtype`` tensor is stored narrowed (else as it is)."""
        return self.name != np.dtype(dtype).name

    def zeros(self, shape, like) -> np.ndarray:
        """A zero residual (``+0.0`` words) on ``like``'s device."""
        return namespace(like).zeros(shape, dtype=self.storage)

    def narrow(self, values: np.ndarray, out: np.ndarray) -> None:
        """``values`` (finite) rounded to nearest even into the stored array ``out``."""
        if self.name == "bfloat16":
            values = values.astype(np.float32, copy=False)  # float64 through float32
            if is_device(out):
                from .bfloat16 import narrow

                narrow(values, out)
            else:
                HOST.to_bf16(values.reshape(-1), out.reshape(-1))
            return
        if self.name == "float16" and not is_device(out) and values.dtype == np.float32:
            HOST.to_f16(values.reshape(-1), out.reshape(-1).view(np.uint16))
        else:
            out[...] = values.astype(self.storage)
        if self.name == "float16" and count_nonfinite(out):  # beyond 65504: saturate
            xp = namespace(out)
            big = xp.isinf(out)
            out[big] = xp.copysign(xp.float16(_F16_MAX), out[big])

    def widen(self, stored: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The values of the stored array (exact) in ``out`` (the tensor's dtype); ``out``."""
        if not is_device(stored) and out.dtype == np.float32 and self.name != "float32":
            fn = HOST.bf16_to_f32 if self.name == "bfloat16" else HOST.f16_to_f32
            fn(stored.reshape(-1).view(np.uint16), out.reshape(-1))
        elif self.name == "bfloat16":
            from .bfloat16 import widen

            out[...] = widen(stored).reshape(out.shape)
        else:
            out[...] = stored
        return out


#: every residual dtype by its name (``ErrorFeedback(codec, residual_dtype=...)``)
RESIDUAL_DTYPES: dict[str, ResidualFormat] = {
    "float32": ResidualFormat("float32", np.dtype(np.float32), 2.0 ** -24),
    "float16": ResidualFormat("float16", np.dtype(np.float16), 2.0 ** -11),
    "bfloat16": ResidualFormat("bfloat16", np.dtype(np.uint16), 2.0 ** -8),
}


def residual_format(name: object) -> ResidualFormat | None:
    """The format named ``name`` (None: the tensor's own dtype); ValueError listing the names."""
    if name is None:
        return None
    if isinstance(name, np.dtype) or (isinstance(name, type) and issubclass(name, np.generic)):
        name = np.dtype(name).name
    if name not in RESIDUAL_DTYPES:
        raise ValueError(f"residual_dtype must be one of {', '.join(RESIDUAL_DTYPES)} (or None: "
                         f"the tensor's dtype), got {name!r}")
    return RESIDUAL_DTYPES[name]
