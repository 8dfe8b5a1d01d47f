"""Finding the ``mpiexec`` to launch multi-rank jobs with (the tuner, the test suite).

``$COLLECTIVES_MPIEXEC`` if set, else the ``mpiexec`` beside the running Python (the one the
``mpich`` wheel installs into a virtual environment), else the one on ``PATH``. Open MPI's gets
``--oversubscribe`` so that more ranks than cores may run (the tests use 8 ranks on 2 cores).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["mpiexec_command"]


def mpiexec_command() -> list[str]:
    """The command prefix that starts ranks, e.g. ``["/venv/bin/mpiexec"]``.

    Raises
    ------
    FileNotFoundError
        If there is no ``mpiexec`` anywhere it looks.
    """
    found = os.environ.get("COLLECTIVES_MPIEXEC") or next(
        (str(c) for c in [Path(sys.executable).with_name("mpiexec")] if c.exists()),
        shutil.which("mpiexec"))
    if not found:
        raise FileNotFoundError("no mpiexec found: install the 'mpich' package or set "
                                "COLLECTIVES_MPIEXEC")
    banner = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in banner or "OpenRTE" in banner:
        return [found, "--oversubscribe"]
    return [found]
