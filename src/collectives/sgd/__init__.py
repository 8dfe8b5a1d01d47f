"""Data-parallel SGD on top of ``collectives`` and ``compress``: ``mpiexec -n 4 python -m collectives.sgd``.

A NumPy MLP trained on the digits data set that ships in this package, its gradients packed into one
fusion buffer and averaged with :func:`collectives.allreduce` (or, with ``--codec``,
:func:`collectives.compressed_allreduce`). See ``docs/sgd.md``.
"""

from .driver import main, train

__all__ = ["main", "train"]
