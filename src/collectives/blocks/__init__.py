"""Building blocks of the allreduce algorithms, each by name in its own table.

Signatures over flat contiguous arrays (``offsets``: element offset of each rank's block, length
p + 1):

- reduce-scatter ``fn(src, out, offsets, op, ctx, opts)``: ``out`` gets block ``rank`` of the
  reduction of every rank's ``src``;
- allgather ``fn(src, out, offsets, ctx, opts)``: ``out`` gets every rank's ``src`` at its offset;
- broadcast ``fn(buf, root, ctx, opts)``: ``buf`` of ``root`` everywhere, in place;
- reduce ``fn(src, out, op, root, ctx, opts)``: the reduction into ``out`` on ``root`` (``out`` is
  None elsewhere).
"""

from __future__ import annotations

from . import binomial, native, ring
from .handwritten import binomial_bcast, binomial_reduce, ring_allgather, ring_reduce_scatter

__all__ = ["REDUCE_SCATTER", "ALLGATHER", "BCAST", "REDUCE"]


REDUCE_SCATTER = {"ring": ring_reduce_scatter, "native": native.reduce_scatter}
ALLGATHER = {"ring": ring_allgather, "native": native.allgather}
BCAST = {"binomial": binomial_bcast, "native": native.bcast}
REDUCE = {"binomial": binomial_reduce, "native": native.reduce}
