"""Which ranks of a communicator share a node: the shared-memory groups of
``Split_type(COMM_TYPE_SHARED)``, optionally cut into emulated nodes of ``Options.node_size``
ranks (how one machine stands in for a cluster in the tests and benchmarks).

Every function here is collective over ``comm`` and gives every rank the same answer. They use
MPI collectives only, never point-to-point messages (``guard.py``: no message of a failed call
can match them).
"""

from __future__ import annotations

from collections import Counter

from mpi4py import MPI

__all__ = ["node_comm", "node_ids", "node_sizes", "not_on_one_node"]


def node_comm(comm: MPI.Comm, node_size: int | None) -> MPI.Comm:
    """The ranks of ``comm`` on this rank's node (collective): ``Split_type(COMM_TYPE_SHARED)``,
    cut into emulated nodes of ``node_size`` ranks when given. Ranks keep ``comm``'s order."""
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    if node_size is None:
        return shared
    node = shared.Split(shared.rank // node_size, shared.rank)
    shared.Free()
    return node


def not_on_one_node(comm: MPI.Comm, node_size: int | None) -> str | None:
    """None if every rank of ``comm`` is on one (emulated) node, else why not (collective;
    every rank gets the same text, naming the ranks not on rank 0's node)."""
    node = node_comm(comm, node_size)
    leader = node.bcast(comm.rank, root=0)  # the node's lowest rank of comm names the node
    node.Free()
    leaders = comm.allgather(leader)
    others = [r for r, lead in enumerate(leaders) if lead != leaders[0]]
    if not others:
        return None
    what = "shared-memory node" if node_size is None else f"emulated node of {node_size} ranks"
    return (f"algorithm 'shm' needs every rank of the communicator on one {what}; rank"
            f"{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} of {comm.size} "
            f"{'are' if len(others) > 1 else 'is'} not on rank 0's node (use 'hierarchical' "
            f"across nodes)")


def node_ids(comm: MPI.Comm, node_size: int | None = None) -> list[int]:
    """For every rank of ``comm``, the lowest rank of its node (collective; the same list on
    every rank)."""
    node = node_comm(comm, node_size)
    lowest = node.bcast(comm.rank, root=0)  # node_comm keeps comm's order: root is the lowest
    node.Free()
    return comm.allgather(lowest)


def node_sizes(comm: MPI.Comm, node_size: int | None = None) -> list[int]:
    """The size of every node of ``comm``, nodes in the order of their lowest rank (collective;
    the same list on every rank). ``[p]``: one node."""
    count = Counter(node_ids(comm, node_size))
    return [count[k] for k in sorted(count)]
