"""PyTorch integration: Horovod's ``DistributedOptimizer`` and DDP comm hooks over collectives.

``import collectives.torch`` needs PyTorch (the ``torch`` extra); ``import collectives`` never
imports it. What is here (see docs/pytorch.md, which has a table of Horovod's calls and ours):

- :func:`init`, :func:`rank`, :func:`size`, :func:`local_rank`, :func:`local_size`: Horovod's
  process functions.
- :func:`DistributedOptimizer` wraps a ``torch.optim`` optimizer as Horovod's does: gradients are
  packed into fusion buckets by post-accumulate-grad hooks and each bucket's (compressed)
  allreduce starts on the progress engine during backward; ``step()`` waits, unpacks and steps.
- :func:`DistributedNeighborAllreduceOptimizer` (BlueFog's name): each rank steps on its own
  gradients, then averages its parameters with its neighbors' in a graph (D-PSGD).
- :func:`allreduce` (a new tensor) and :func:`allreduce_` (in place), :func:`broadcast_parameters`,
  :func:`broadcast_optimizer_state`; :class:`Compression` holds Horovod's codec names.
- :func:`comm_hook` with :class:`CommHookState` for ``DistributedDataParallel.register_comm_hook``,
  :func:`gossip_hook` with :class:`GossipHookState` (each bucket averaged with the graph
  neighbors' instead of allreduced), and :func:`init_process_group`, which sets up torch.distributed's gloo group from the MPI job.
"""

try:
    import torch as _torch  # noqa: F401 - the clear error, before anything else
except ImportError as _exc:  # pragma: no cover - exercised where torch is absent
    raise ImportError("collectives.torch needs PyTorch: pip install 'mpi-collectives[torch]' "
                      "(or pip install torch)") from _exc

from ._common import Compression
from .basics import (Average, Max, Min, Product, Sum, init, is_initialized, local_rank,
                     local_size, rank, size)
from .ddp import CommHookState, comm_hook, init_process_group
from .gossip_hook import GossipHookState, gossip_hook
from .functions import allreduce, allreduce_, broadcast_optimizer_state, broadcast_parameters
from .neighbor import DistributedNeighborAllreduceOptimizer
from .optimizer import DistributedOptimizer

__all__ = ["init", "is_initialized", "rank", "size", "local_rank", "local_size", "Average", "Sum",
           "Min", "Max", "Product",
           "DistributedOptimizer", "DistributedNeighborAllreduceOptimizer", "allreduce", "allreduce_", "broadcast_parameters",
           "broadcast_optimizer_state", "Compression", "comm_hook", "CommHookState",
           "gossip_hook", "GossipHookState",
           "init_process_group"]
