"""Numba kernels behind the codecs (private).

Every kernel module in this package takes only NumPy arrays and scalars, never codec objects, and
is compiled with the single option set :data:`NJIT` so that caching and floating-point semantics
are the same everywhere. Codecs reach them through the host backend (:mod:`.host`, loaded by
:data:`compress._backends.HOST` at the first kernel a codec runs), so this package itself imports
nothing: ``import compress`` does not import Numba. ``fastmath`` stays off: several kernels rely
on exact IEEE behaviour (round-to-even tricks, NaN ordering through integer views). The one
exception, :data:`NJIT_REDUCE`, only adds reassociation, for sums that become header parameters.
"""

NJIT = dict(cache=True, nogil=True, fastmath=False)

__all__ = ["NJIT", "NJIT_REDUCE"]

#: For float reductions whose result is a codec *parameter* (a scale stored in the header), where
#: being within rounding of the exact sum is all that matters: letting LLVM reassociate the sum
#: makes it SIMD (docs/benchmarks.md, "Numbers behind the code"). Never used where bits must
#: match a reference.
NJIT_REDUCE = dict(NJIT, fastmath={"reassoc", "nsz"})
