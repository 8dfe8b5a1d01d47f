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
