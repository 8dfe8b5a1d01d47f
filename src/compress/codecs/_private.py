"""What the codecs with private randomness share (QSGD, TernGrad, natural, DGC) (private).

Each of them draws one stream per encode from its own ``numpy.random.Generator``
(:mod:`compress._seeding`), made once, when the codec is constructed, from its last parameter
``seed``: None (fresh entropy), an int, or a Generator used as it is. The generator's state is
the codec's checkpoint state (:meth:`compress.base.Codec.state_dict`).
"""

from __future__ import annotations

from typing import ClassVar

from .._seeding import make_generator

__all__ = ["PrivateRandom"]


class PrivateRandom:
    """Base of the codecs whose randomness is their own; the codec (a dataclass) declares the
    field ``seed`` last and checks its other parameters in :meth:`_check`."""

    randomness: ClassVar[str] = "private"
    seed: object

    def __post_init__(self):
        self._check()
        self._rng = make_generator(self.seed)

    def _check(self) -> None:
        """Raise ValueError for a parameter of the codec out of its range (before the seed's
        own check)."""
