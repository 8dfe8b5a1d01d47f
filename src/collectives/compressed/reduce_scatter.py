"""Compressed reduce-scatter strategies: rank ``i`` gets block ``i`` of the aggregate.

Every rank's ``x`` is the whole vector, cut into ``p`` blocks at ``offsets`` (the caller's
``counts=``, or a near-equal split); rank ``i`` gets the sum (or mean, or majority vote) of every
rank's block ``i``, decoded.

"alltoall" (any codec that encodes a 1-D block by itself; the first phase of
:mod:`.two_phase`, Tang et al. 2021). Each rank compresses each destination block ``i``, through
its memory when it has one, under the sub-key ``key#chunk{i}``: error feedback keeps one residual
per destination block, the same residuals two-phase keeps. A pairwise alltoallv
(``_exchange.py``) sends block ``i`` to rank ``i``, which decodes the ``p`` contributions (its own
included) and aggregates them in rank order (:meth:`TensorCoding.aggregate_into`): every block's
bits follow from the payloads alone. Cost with ``c`` payload bytes per input byte: ``(p-1)``
rounds of ``8`` bytes of size and one payload, ``c n (p-1)/p`` bytes sent in all (each block's
header aside); ``p`` decodes of ``n/p`` elements.

"summable" (:class:`compress.protocols.ElementSummable` and
:class:`~compress.protocols.LowRankSummable` codecs). Element codecs (fp16, bf16, random-k, none)
encode each destination block into its representation (scaled by ``1/p`` first for op "avg", as
the summable allreduce does), and one ring reduce-scatter of the representations, added by the
codec's ``summable_add``, leaves block ``i``'s sum on rank ``i``, decoded there; error feedback
keeps one residual per destination block, as "alltoall" does. The representation's bytes travel
once, without headers, but are summed in the representation's own precision (fp16 sums in fp16).
A low-rank codec (PowerSGD) factors the whole matrix ``x``: a block of it has no matrix shape. It
runs the summable allreduce's two rounds (:mod:`.summable`; ``(rows + cols) r`` elements summed
twice), and each rank keeps its block of the reconstruction; its residual is the whole tensor's,
under ``key`` (PyTorch's rule: the compensated input minus the aggregate). A tensor it does not
factor (1-d, too small to gain) is reduce-scattered as it is.
"""

from __future__ import annotations

import numpy as np
from compress.codecs.none import Identity
from compress.protocols import ElementSummable, LowRankSummable
from mpi4py import MPI

from .._runtime.arrays import xp
from .._runtime.context import Context
from ..blocks import REDUCE_SCATTER
from ..ops import Op, get_op
from ..options import Options
from . import summable as _summable
from ._exchange import alltoallv
from .coding import TensorCoding

__all__ = ["alltoall", "summable"]

#: how a tensor that a low-rank codec does not factor travels: its values, summed
_RAW = Identity()


def alltoall(x: np.ndarray, offsets: list[int], out: np.ndarray, coding: TensorCoding,
             ctx: Context | None, opts: Options) -> None:
    """Block ``rank`` of the aggregate of every rank's flat ``x`` into ``out`` (``ctx``: None
    with one rank)."""
    p = coding.world
    r = 0 if p == 1 else ctx.comm.rank
    # block i goes, compressed, to rank i
    payloads = [coding.encode(x[offsets[i]:offsets[i + 1]], part=i) for i in range(p)]
    mine = payloads if p == 1 else alltoallv(payloads, ctx)
    coding.aggregate_into(mine, offsets[r + 1] - offsets[r], out)


def summable(x: np.ndarray, offsets: list[int], out: np.ndarray, coding: TensorCoding,
             ctx: Context | None, opts: Options) -> None:
    """As :func:`alltoall`, for the summable codecs (the module docstring)."""
    base = coding.codec
    p = coding.world
    r = 0 if p == 1 else ctx.comm.rank
    if isinstance(base, LowRankSummable) and base.compresses(coding.shape, x.dtype):
        whole = xp(x).empty(x.size, dtype=x.dtype)
        if p == 1:  # what a compressed allreduce on one rank gives: the codec's own round trip
            coding.aggregate_into([coding.encode(x)], x.size, whole)
        else:
            _summable.allreduce(x, whole, coding, ctx, opts, "auto")
        out[...] = whole[offsets[r]:offsets[r + 1]]
        return
    if not isinstance(base, ElementSummable):  # a tensor the low-rank codec does not factor
        base = _RAW
    ef = coding.state.error_feedback
    reps, rep_offsets = [], [0]
    for i in range(p):
        block, part = x[offsets[i]:offsets[i + 1]], coding.subkey(i)
        c = block if ef is None else ef.compensate(block, key=part)
        scaled = c / p if coding.average else c
        rep = base.summable_encode(scaled, key=part, step=coding.step)
        if ef is not None:
            own = base.summable_decode(rep, shape=block.shape, dtype=x.dtype, key=part,
                                       step=coding.step)
            ef.remember(c, own * p if coding.average else own, key=part)
        reps.append(rep)
        rep_offsets.append(rep_offsets[-1] + rep.size)
    rep = xp(x).concatenate(reps) if p > 1 else reps[0]
    mine = rep[rep_offsets[r]:rep_offsets[r + 1]]
    if p > 1:
        ufunc = base.summable_add
        op = get_op("sum", rep.dtype) if ufunc is np.add else Op("sum", ufunc, MPI.SUM)
        mine = xp(rep).empty(rep_offsets[r + 1] - rep_offsets[r], dtype=rep.dtype)
        REDUCE_SCATTER["ring"](rep, mine, rep_offsets, op, ctx, opts)
    base.summable_decode(mine, shape=out.shape, dtype=x.dtype, key=coding.subkey(r),
                         step=coding.step, out=out)
