"""PyTorch integration: Horovod's ``DistributedOptimizer`` and DDP comm hooks over collectives.

``import collectives.torch`` needs PyTorch (the ``torch`` extra); ``import collectives`` never
imports it. What is here (see docs/pytorch.md, which has a table of Horovod's calls and ours):

- Horovod's surface, so that a Horovod script runs with ``import collectives.torch as hvd``:
  process functions (:mod:`.basics`), build questions (:mod:`.build`), tensor collectives with
  handles, ``join`` and process sets (:mod:`.mpi_ops`, :mod:`.negotiation`,
  :mod:`.process_sets`), ``start_timeline`` (:mod:`.timeline`), :class:`SyncBatchNorm` (batch
  statistics over every rank's samples, :mod:`.sync_batch_norm`).
- torch.distributed's names for ``gather``, ``scatter``, ``send``, ``recv``, ``isend`` and
  ``irecv`` on tensors (:mod:`.distributed`), over the library's gather, scatter and
  point-to-point calls.
- :func:`DistributedOptimizer` wraps a ``torch.optim`` optimizer as Horovod's does: gradients are
  packed into fusion buckets by post-accumulate-grad hooks and each bucket's (compressed)
  allreduce starts on the progress engine during backward; ``step()`` waits, unpacks and steps.
- :func:`DistributedNeighborAllreduceOptimizer` (BlueFog's name): each rank steps on its own
  gradients, then averages its parameters with its neighbors' in a graph (D-PSGD).
- :func:`broadcast_parameters`, :func:`broadcast_optimizer_state`; :class:`Compression` holds
  Horovod's compressors (``Compression.fp16`` is the ``fp16`` codec inside the collectives).
- :func:`comm_hook` with :class:`CommHookState` for ``DistributedDataParallel.register_comm_hook``,
  :func:`gossip_hook` with :class:`GossipHookState` (each bucket averaged with the graph
  neighbors' instead of allreduced), and :func:`init_process_group`, which sets up torch.distributed's gloo group from the MPI job.
- :mod:`collectives.torch.parallel` (imported by name): tensor-parallel ``ColumnParallelLinear``
  and ``RowParallelLinear`` (PyTorch's ``ColwiseParallel``/``RowwiseParallel``) on a mesh axis.
- Sharded data parallelism: :class:`ShardedOptimizer` (ZeRO stages 1-2, as
  ``ZeroRedundancyOptimizer``, :mod:`.sharded`) and :func:`fully_shard` (stage 3, as FSDP2's,
  :mod:`.fully_shard`); docs/sharded-torch.md.
"""

try:
    import torch as _torch  # noqa: F401 - the clear error, before anything else
except ImportError as _exc:  # pragma: no cover - exercised where torch is absent
    raise ImportError("collectives.torch needs PyTorch: pip install 'mpi-collectives[torch]' "
                      "(or pip install torch)") from _exc

from ._common import Compression, Compressor
from .basics import (Adasum, Average, Max, Min, Product, Sum, cross_rank, cross_size, init,
                     is_homogeneous, is_initialized, local_rank, local_size, rank, shutdown, size)
from .build import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built,
                    mpi_enabled, mpi_threads_supported, nccl_built, rocm_built)
from .ddp import CommHookState, comm_hook, init_process_group
from .distributed import Work, gather, irecv, isend, recv, scatter, send
from .gossip_hook import GossipHookState, gossip_hook
from .functions import broadcast_optimizer_state, broadcast_parameters
from .fully_shard import full_state_dict, fully_shard, load_full_state_dict
from .mpi_ops import (HorovodInternalError, allgather, allgather_async, allgather_object,
                      allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall,
                      alltoall_async, barrier, broadcast,
                      broadcast_, broadcast_async, broadcast_async_, broadcast_object,
                      grouped_allgather, grouped_allgather_async, grouped_allreduce,
                      grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                      grouped_reducescatter, grouped_reducescatter_async, join, poll,
                      reducescatter, reducescatter_async, sparse_allreduce_async, synchronize)
from .neighbor import DistributedNeighborAllreduceOptimizer
from .optimizer import DistributedOptimizer
from .sharded import ShardedOptimizer
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .sync_batch_norm import SyncBatchNorm
from .timeline import start_timeline, stop_timeline

__all__ = [
    # processes (Horovod's)
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous",
    # how it was built (Horovod's questions, answered for collectives)
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
    "nccl_built", "ccl_built", "ddl_built", "cuda_built", "rocm_built",
    # ops and errors
    "Average", "Sum", "Min", "Max", "Product", "Adasum", "HorovodInternalError",
    # tensor collectives (Horovod's mpi_ops)
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "alltoall", "alltoall_async", "barrier",
    "sparse_allreduce_async", "synchronize", "poll", "join", "broadcast_object",
    "allgather_object",
    # torch.distributed's names
    "gather", "scatter", "send", "recv", "isend", "irecv", "Work",
    # process sets
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    # training
    "DistributedOptimizer", "DistributedNeighborAllreduceOptimizer", "broadcast_parameters",
    "broadcast_optimizer_state", "Compression", "Compressor", "start_timeline", "stop_timeline",
    "SyncBatchNorm",
    # sharded data parallelism (ZeRO 1-2, and 3 in FSDP2's shape)
    "ShardedOptimizer", "fully_shard", "full_state_dict", "load_full_state_dict",
    # DDP
    "comm_hook", "CommHookState", "gossip_hook", "GossipHookState", "init_process_group"]
