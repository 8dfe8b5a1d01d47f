"""PyTorch integration: Horovod's ``DistributedOptimizer`` and DDP comm hooks over collectives.

``import collectives.torch`` needs PyTorch (the ``torch`` extra); ``import collectives`` never
imports it. What is here (see docs/pytorch.md):

- :func:`DistributedOptimizer` wraps a ``torch.optim`` optimizer as Horovod's does: gradients are
  packed into fusion buckets by post-accumulate-grad hooks and each bucket's (compressed)
  allreduce starts on the progress engine during backward; ``step()`` waits, unpacks and steps.
- :func:`broadcast_parameters`, :func:`broadcast_optimizer_state`, :func:`allreduce_`.
- :func:`comm_hook` with :class:`CommHookState` for ``DistributedDataParallel.register_comm_hook``,
  and :func:`init_process_group`, which sets up torch.distributed's gloo group from the MPI job.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401 - the clear error, before anything else
except ImportError as exc:  # pragma: no cover - exercised where torch is absent
    raise ImportError("collectives.torch needs PyTorch: pip install 'mpi-collectives[torch]' "
                      "(or pip install torch)") from exc

from .ddp import CommHookState, comm_hook, init_process_group
from .functions import allreduce_, broadcast_optimizer_state, broadcast_parameters
from .optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
           "allreduce_", "comm_hook", "CommHookState", "init_process_group"]
