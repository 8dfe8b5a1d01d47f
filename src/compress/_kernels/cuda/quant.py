"""Level quantization device kernels (private): the host's :mod:`compress._kernels.quant` layout.

Encoding is three launches: :func:`~compress._kernels.cuda.reduce.bucket_scales` (one block per bucket),
:func:`level_codes` (one thread per element, the host's ``level_code``), and, for codes narrower or wider
than a byte, :func:`~compress._kernels.cuda.bits.pack_codes`. Decoding is one thread per element.
"""

from numba import cuda, float64, int64

from .bits import code_at
from .scalar import level_code, scale_is_finite

__all__ = ["level_codes", "dequantize_levels"]


@cuda.jit
def level_codes(x, bucket, s, stochastic, seed_lo, seed_hi, scales, codes):
    """``codes[i]`` = code of element ``i`` against the stored scale of its bucket."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        scale = float64(scales[i // bucket])  # the value the decoder will see
        if scale_is_finite(scale):
            mult = s / scale if scale > 0.0 else 0.0
            codes[i] = level_code(float64(x[i]), mult, s, stochastic, i, seed_lo, seed_hi)
        else:  # the host's rule for a bucket that held a non-finite value: level 0
            codes[i] = s


@cuda.jit
def dequantize_levels(packed, bits, s, bucket, scales, out, bad):
    """Inverse of the encoding; ``bad[0] +=`` the number of codes above ``2 s``."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        c = int64(packed[i]) if bits == 8 else code_at(packed, bits, i)
        if c > 2 * s:
            cuda.atomic.add(bad, 0, 1)
        out[i] = (c - s) * (float64(scales[i // bucket]) / s)
