"""collectives: hand-written MPI collectives for data-parallel deep learning.

``collectives.allreduce(x, algorithm="ring")`` and friends; see :mod:`collectives.api` for the
conventions and :data:`ALGORITHMS` for the catalogue.
"""

import sys as _sys

from ._runtime.mpilib import mpi_library  # first: a clear ImportError when there is no MPI library
from ._runtime.arrays import SUPPORTED_DTYPES
from ._runtime.shmem import empty, zeros
from .algorithms import ALGORITHMS, ALLTOALL, BARRIER
from .api import (allgather, allreduce, alltoall, barrier, bcast, gather, reduce, reduce_scatter,
                  scatter)
from .blocks import ALLGATHER, BCAST, GATHER, REDUCE, REDUCE_SCATTER, SCATTER
from .compressed import (STRATEGIES, AutoCompression, CompressionState, CodecSpeed,
                         compressed_allgather, compressed_allreduce, compressed_reduce_scatter)
from ._runtime.context import reset
from ._runtime.guard import CollectiveError
from .engine import EngineError, Request, StallWarning, testall, waitall, waitany
from .decentralized.neighbor import neighbor_allgather, neighbor_allreduce
from .engine.nonblocking import (NeighborPlan, Plan, allreduce_init, iallgather, iallreduce,
                                 ialltoall, ibarrier, ibcast, icompressed_allgather,
                                 icompressed_allreduce, icompressed_reduce_scatter, igather,
                                 ineighbor_allgather, ineighbor_allreduce, ireduce,
                                 ireduce_scatter, iscatter, neighbor_allreduce_init)
from .decentralized import topology
from .mesh.mesh import Mesh
from .pt2pt.messages import (P2PPlan, P2PRequest, irecv, isend, recv, recv_init, send,
                             send_init, sendrecv)
from .ops import OPS
from .options import Options
from ._runtime.traffic import TRAFFIC
from .decentralized.ssp import ParameterServer
from .decentralized.window import Window
from .decentralized.adpsgd import PairwiseAveraging
from .decentralized.choco import ChocoGossip
from .tools.warmup import preload

__all__ = [
    "allreduce", "reduce_scatter", "allgather", "bcast", "reduce", "alltoall", "barrier", "gather",
    "scatter", "compressed_allreduce", "compressed_reduce_scatter", "compressed_allgather",
    "iallreduce", "ireduce_scatter", "iallgather", "ibcast", "ireduce", "ialltoall", "ibarrier",
    "igather", "iscatter", "icompressed_allreduce", "icompressed_reduce_scatter",
    "icompressed_allgather",
    "neighbor_allreduce", "neighbor_allgather", "ineighbor_allreduce", "ineighbor_allgather",
    "topology",
    "send", "recv", "sendrecv", "isend", "irecv", "P2PRequest", "send_init",
    "recv_init", "P2PPlan",
    "Mesh",
    "allreduce_init", "Plan", "neighbor_allreduce_init", "NeighborPlan", "Request", "waitall",
    "waitany", "testall", "StallWarning",
    "EngineError", "CollectiveError", "reset",
    "empty", "zeros",
    "CompressionState", "AutoCompression", "CodecSpeed", "STRATEGIES", "TRAFFIC", "Window",
    "ParameterServer", "PairwiseAveraging", "ChocoGossip",
    "ALGORITHMS", "REDUCE_SCATTER", "ALLGATHER", "BCAST", "REDUCE", "ALLTOALL", "BARRIER",
    "GATHER", "SCATTER",
    "OPS", "Options", "SUPPORTED_DTYPES", "mpi_library", "flight_recorder", "preload",
]
__version__ = "0.1.0"

from ._runtime import crash as _crash  # noqa: E402 - an unhandled error on any rank ends the job

_crash.install()

from .diagnostics import flight_recorder  # noqa: E402 - a dump on SIGUSR1 (where no handler is set)

flight_recorder.install_signal()

from .diagnostics import timeline  # noqa: E402 - COLLECTIVES_TIMELINE starts one (docs/timeline.md)

timeline.start_from_env()

#: The modules users import by the short paths (``from collectives.topology import ring``): the
#: package's folders hold them (``decentralized/``, ``diagnostics/``), and these names are theirs too.
PUBLIC_MODULES = {"topology": topology, "timeline": timeline, "flight_recorder": flight_recorder}
for _name, _module in PUBLIC_MODULES.items():
    _sys.modules.setdefault(f"{__name__}.{_name}", _module)
del _name, _module
