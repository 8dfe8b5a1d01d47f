import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import os

# The suite must not depend on this machine's state: a per-machine tuning file (written by
# collectives-tune into ~/.cache) would change what algorithm="auto" runs. Tests that exercise
# tuning point COLLECTIVES_TUNING_FILE at their own file.
os.environ["COLLECTIVES_TUNING_FILE"] = "off"
