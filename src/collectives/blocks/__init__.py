"""Building blocks of the allreduce algorithms, each by name in its own table.

Signatures over flat contiguous arrays (``offsets``: element offset of each rank's block, length
p + 1):

- reduce-scatter ``fn(src, out, offsets, op, ctx, opts)``: ``out`` gets block ``rank`` of the
  reduction of every rank's ``src``;
- allgather ``fn(src, out, offsets, ctx, opts)``: ``out`` gets every rank's ``src`` at its offset;
- broadcast ``fn(buf, root, ctx, opts)``: ``buf`` of ``root`` everywhere, in place;
- reduce ``fn(src, out, op, root, ctx, opts)``: the reduction into ``out`` on ``root`` (``out`` is
  None elsewhere);
- alltoall ``fn(src, dst, sendoffsets, recvoffsets, ctx, opts)``: block ``j`` of ``src`` (at
  ``sendoffsets``) to rank ``j``, block ``i`` of ``dst`` (at ``recvoffsets``) from rank ``i``;
  ``recvoffsets`` is None when every block has the same size (``MPI_Alltoall``: the receive
  blocks sit at ``sendoffsets`` too), which Bruck requires;
- barrier ``fn(ctx, opts)``;
- gather ``fn(src, out, offsets, root, ctx, opts)``: every rank's ``src`` at its offset of ``out``
  on ``root`` (``out`` is None elsewhere);
- scatter ``fn(src, out, offsets, root, ctx, opts)``: block ``rank`` of ``src`` on ``root`` into
  ``out`` (``src`` is None elsewhere).
"""

from __future__ import annotations

from . import auto, binomial, native, node_aware, ring
from .handwritten import (binomial_bcast, binomial_gather, binomial_reduce, binomial_scatter,
                          bruck_alltoall, dissemination_barrier, pairwise_alltoall, ring_allgather,
                          ring_reduce_scatter)

__all__ = ["REDUCE_SCATTER", "ALLGATHER", "BCAST", "REDUCE", "ALLTOALL", "BARRIER", "GATHER",
           "SCATTER", "EQUAL_BLOCKS_ONLY"]


REDUCE_SCATTER = {"ring": ring_reduce_scatter, "native": native.reduce_scatter}
ALLGATHER = {"ring": ring_allgather, "native": native.allgather}
BCAST = {"binomial": binomial_bcast, "native": native.bcast}
REDUCE = {"binomial": binomial_reduce, "native": native.reduce}
ALLTOALL = {"auto": auto.alltoall, "pairwise": pairwise_alltoall, "bruck": bruck_alltoall,
            "hierarchical": node_aware.alltoall, "native": native.alltoall}
#: the alltoall entries that need equal blocks (no ``counts=``)
EQUAL_BLOCKS_ONLY = frozenset({"bruck"})
BARRIER = {"auto": dissemination_barrier, "dissemination": dissemination_barrier,
           "native": native.barrier}
GATHER = {"binomial": binomial_gather, "native": native.gather}
SCATTER = {"binomial": binomial_scatter, "native": native.scatter}
