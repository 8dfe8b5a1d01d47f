"""One repeat of native's lane (abort mode's run: MPI_Allreduce on COMM_SELF, no other rank to
wait for, so callgrind's count is the same from run to run): ``python lane_count.py CALLS``."""
import sys
import types

import numpy as np
from mpi4py import MPI

from collectives.algorithms import native
from collectives.ops import get_op
from collectives.options import Options

calls = int(sys.argv[1])
x = np.ones(2, np.float32)
y = np.empty_like(x)
op = get_op("sum", x.dtype)
lane = native.Lane(y, op)
ctx = types.SimpleNamespace(active=None, comm=MPI.COMM_SELF, control_comm=None,
                            agreed=getattr(lane, "sig", None))
opts = Options.from_env()
for _ in range(calls):
    lane(x, y, op, ctx, opts)
