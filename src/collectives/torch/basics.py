"""Horovod's process functions: ``init``, ``shutdown``, ``rank``, ``size``, ``local_rank``,
``local_size``, ``cross_rank``, ``cross_size``, ``is_homogeneous``.

A Horovod script ported to ``collectives.torch`` (``import collectives.torch as hvd``) keeps its
first lines::

    hvd.init()
    torch.set_num_threads(1)
    model.to(...); lr = 0.01 * hvd.size()
    if hvd.rank() == 0: ...

:func:`init` fixes the communicator the functions of ``collectives.torch`` use when given none
(``MPI.COMM_WORLD`` by default; Horovod's ``hvd.init(comm=...)`` takes one too) and finds this
rank's place on its node, collectively: every rank of the communicator calls it, once, before
the others. :func:`rank` and :func:`size` work without it (on ``MPI.COMM_WORLD``);
:func:`local_rank` and :func:`local_size` need it, as Horovod's do. ``cross_rank`` and
``cross_size`` are Horovod's too: this rank's place among the ranks of the same local rank on
every node (one per node on a homogeneous job), found by ``init`` with ``Split(local_rank)``.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from .._runtime.nodes import node_comm
from .._runtime.validate import check_comm

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "is_homogeneous", "default_comm", "on_shutdown",
           "Average", "Sum", "Min", "Max", "Product", "Adasum"]

#: Horovod's reduction constants, as the op names of ``collectives`` (``op=hvd.Average``).
Average, Sum, Min, Max, Product = "avg", "sum", "min", "max", "prod"
#: Horovod's Adasum: a name only, so that ``op=hvd.Adasum`` raises a clear error (not offered).
Adasum = "adasum"

_COMM: list[Any] = [None]            # init()'s communicator
# what init() finds: (local rank, local size, cross rank, cross size, homogeneous)
_LOCAL: list[tuple[int, int, int, int, bool] | None] = [None]
_SHUTDOWN: list[Any] = []            # callbacks of shutdown() (the process sets' registry)


def init(comm: Any = None) -> None:
    """Use ``comm`` (default ``MPI.COMM_WORLD``) wherever a function of ``collectives.torch`` is
    given no communicator, and find which of its ranks share this rank's node (collective over
    ``comm``: ``Split_type(COMM_TYPE_SHARED)``). Calling it again replaces both."""
    comm = MPI.COMM_WORLD if comm is None else comm
    check_comm("collectives.torch.init", comm)
    node = node_comm(comm, None)
    cross = comm.Split(node.rank, comm.rank)
    sizes = set(comm.allgather(node.size))
    _LOCAL[0] = (node.rank, node.size, cross.rank, cross.size, len(sizes) == 1)
    node.Free()
    cross.Free()
    _COMM[0] = comm


def on_shutdown(fn: Any) -> None:
    """Call ``fn()`` at :func:`shutdown` (before the communicator is forgotten)."""
    _SHUTDOWN.append(fn)


def shutdown() -> None:
    """Horovod's ``hvd.shutdown()``: forget :func:`init`'s communicator and the process sets
    (``MPI.COMM_WORLD`` stays; MPI itself is finalised at exit). ``init()`` may follow."""
    for fn in _SHUTDOWN:
        fn()
    _COMM[0] = None
    _LOCAL[0] = None


def is_initialized() -> bool:
    """Whether :func:`init` has run (Horovod's ``hvd.is_initialized()``)."""
    return _COMM[0] is not None


def default_comm() -> Any:
    """The communicator of :func:`init`, or ``MPI.COMM_WORLD`` before it."""
    comm = _COMM[0]
    return MPI.COMM_WORLD if comm is None else comm


def rank() -> int:
    """This process's rank in :func:`default_comm`."""
    return default_comm().rank


def size() -> int:
    """The number of ranks of :func:`default_comm`."""
    return default_comm().size


def _local(what: str) -> tuple[int, int, int, int, bool]:
    local = _LOCAL[0]
    if local is None:
        raise ValueError(f"collectives.torch.{what}() needs collectives.torch.init() first (it is "
                         "collective: every rank calls it, and it finds which ranks share a node)")
    return local


def local_rank() -> int:
    """This rank's rank among the ranks of :func:`default_comm` on its node (after :func:`init`;
    ``ValueError`` before, as Horovod raises)."""
    return _local("local_rank")[0]


def local_size() -> int:
    """How many ranks of :func:`default_comm` share this rank's node (after :func:`init`)."""
    return _local("local_size")[1]


def cross_rank() -> int:
    """This rank's rank among the ranks of the same local rank (one per node), after :func:`init`."""
    return _local("cross_rank")[2]


def cross_size() -> int:
    """How many ranks have this rank's local rank (the number of nodes on a homogeneous job)."""
    return _local("cross_size")[3]


def is_homogeneous() -> bool:
    """Whether every node runs the same number of ranks (after :func:`init`)."""
    return _local("is_homogeneous")[4]
