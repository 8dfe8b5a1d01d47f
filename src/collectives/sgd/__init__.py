"""Data-parallel SGD on top of ``collectives`` and ``compress``: ``mpiexec -n 4 python -m collectives.sgd``.

A NumPy MLP trained on the digits data set that ships in this package, its gradients packed into one
fusion buffer and averaged with :func:`collectives.allreduce` (or, with ``--codec``,
:func:`collectives.compressed_allreduce`). See ``docs/sgd.md``.

:func:`main` and :func:`train` are imported on first use, so that ``python -m
collectives.sgd.report`` (which the driver imports) starts without runpy's warning about a module
already imported.
"""

__all__ = ["main", "train"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from . import driver

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
