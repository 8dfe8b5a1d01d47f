import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The multi-rank tests (tests/mpi) as one pytest item per test and world size, run under mpiexec.
pytest_plugins = ["mpi_launch"]

import os

# The suite must not depend on this machine's state: a per-machine tuning file (written by
# collectives-tune into ~/.cache) would change what algorithm="auto" runs. Tests that exercise
# tuning point COLLECTIVES_TUNING_FILE at their own file.
os.environ["COLLECTIVES_TUNING_FILE"] = "off"

# Timeouts, stall warnings and unhandled errors make the flight recorder dump (by default into
# ./collectives-dump): the tests' dumps go to a directory of their own, never into the checkout.
import tempfile

os.environ.setdefault("COLLECTIVES_DUMP_DIR",
                      str(Path(tempfile.gettempdir()) / f"collectives-test-dumps-{os.getuid()}"))

# Device codec kernels (Numba CUDA) run on the GPU when there is one, and otherwise on Numba's CUDA
# simulator, so their tests run everywhere. Numba reads this when it is first imported.
if not (Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia").exists()):
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


#: set while the outer run writes bytecode that the environment would not have written
_BYTECODE: dict[str, bool] = {}


def pytest_configure(config):
    """The suite starts hundreds of Python processes (the ranks of every job, the driver's and
    the tools' runs), each importing the package and, in the ranks, pytest's assertion-rewritten
    test modules. Where bytecode is not written (``PYTHONDONTWRITEBYTECODE``, as on the CI
    machines) each of them would compile all of that from source again: some 0.2 s of a core per
    process for ``src/``, 2.5 s per rank for ``tests/mpi``. The outer run writes it once instead,
    as pip compiles a regular install (an editable one it does not): ``src/`` and ``bench/`` by
    ``compileall``, and the test modules while it collects them (the setting is back in place
    when collection ends). Processes the suite starts keep the environment's setting and read
    what is there; only the checkout's own files are written, where missing or stale."""
    from mpi_launch import _under_mpiexec

    if not sys.dont_write_bytecode or _under_mpiexec():
        return  # bytecode is written as modules are imported; or a rank, whose parent did it
    import compileall

    root = Path(__file__).resolve().parent.parent
    for folder in (root / "src", root / "bench"):
        if folder.is_dir():
            compileall.compile_dir(folder, quiet=2, workers=1)
    _BYTECODE["restore"] = True
    sys.dont_write_bytecode = False


def pytest_collection_finish(session):
    if _BYTECODE.pop("restore", False):
        sys.dont_write_bytecode = True
