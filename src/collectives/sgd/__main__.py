"""Entry point: ``mpiexec -n 4 python -m collectives.sgd [options]`` (see ``--help``)."""

import sys

from .driver import script

sys.exit(script())
