"""Summable strategy: allreduce the compressed representation itself (fp16, bf16, random-k,
PowerSGD factors, or no compression).

For codecs whose representation adds up (``summable``), nothing needs decoding between ranks:

- element codecs (fp16, bf16, random-k, none) expose ``summable_encode`` (the representation as
  one array), ``summable_add`` (how two representations add, e.g. bf16 addition on uint16 words)
  and ``summable_decode``. Each rank encodes (scaled by 1/p first for op="avg", so fp16 sums cannot
  overflow where the mean would not), the representations are summed by one dense allreduce of the
  foundation algorithms, and every rank decodes the same sum.
- PowerSGD (Vogels et al. 2019) exposes its two-round protocol: ``P = M Q`` summed, orthogonalised,
  ``Q = M^T P_hat`` summed, ``M ~ P_hat Q^T``. A tensor it does not compress (``compresses``: 1-d
  tensors, matrices too small to gain) is summed as it is, like the identity codec's.

Error feedback, when the codec is wrapped in ``compress.ErrorFeedback``: the residual is added
before encoding, and the new residual is the compensated input minus what this rank's own
representation decodes to (for PowerSGD, minus the aggregated approximation, as PyTorch's hook).

Cost: that of the dense allreduce on the representation (e.g. ring: 2 (p-1) alpha + 2 c n (p-1)/p
beta with c the representation's size ratio: 1/2 for fp16, k/n for random-k).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from compress.arrays import same_memory
from compress.codecs.none import Identity
from compress.protocols import ElementSummable, LowRankSummable
from mpi4py import MPI

from .._runtime.arrays import xp
from .._runtime.context import Context
from ..algorithms import ALGORITHMS, FLAT, auto
from ..ops import Op, get_op
from ..options import Options
from .coding import TensorCoding

__all__ = ["allreduce"]

#: how a tensor that a low-rank codec does not compress travels: its values, summed
_RAW = Identity()


def _sum(rep: np.ndarray, ufunc: np.ufunc, ctx: Context, opts: Options, algorithm: str) -> None:
    """Sum ``rep`` over all ranks in place with a hand-written (or native, for np.add) algorithm:
    any of :data:`collectives.ALGORITHMS`, "auto" resolved for the representation's size as a
    dense allreduce of it resolves (the tuning file, the two-level model, "shm" on one node)."""
    fn = auto.resolve(rep, ctx, opts) if algorithm == "auto" else ALGORITHMS[algorithm]
    if ufunc is not np.add:  # MPI cannot add bf16 words
        if fn is FLAT["native"]:
            fn = FLAT["recursive_doubling"]
        if opts.inter_algorithm == "native":  # "hierarchical" across nodes
            opts = replace(opts, inter_algorithm="recursive_doubling")
    op = get_op("sum", rep.dtype) if ufunc is np.add else Op("sum", ufunc, MPI.SUM)
    fn(rep, rep, op, ctx, opts)


def allreduce(x: np.ndarray, out: np.ndarray, coding: TensorCoding, ctx: Context, opts: Options,
              algorithm: str) -> None:
    base = coding.codec
    ef = coding.state.error_feedback
    # x plus this rank's residual (kept in the tensor's shape): compress.ErrorFeedback's
    # compensate/remember pair, so the error feedback is the one compress writes
    c = x if ef is None else ef.compensate(x.reshape(coding.shape), key=coding.key).reshape(-1)
    if isinstance(base, LowRankSummable) and base.compresses(coding.shape, x.dtype):
        # PowerSGD's two rounds, on the tensor's matrix shape
        m = c.reshape(coding.shape)
        lib = xp(m)
        p = lib.ascontiguousarray(base.compute_p(m, key=coding.key))
        _sum(p.reshape(-1), np.add, ctx, opts, algorithm)
        p_hat = base.orthogonalize(p)
        q = lib.ascontiguousarray(base.compute_q(m, p_hat))
        _sum(q.reshape(-1), np.add, ctx, opts, algorithm)
        if coding.average:
            q /= coding.world
        # P_hat Q^T straight into out (m, read no more, may be out itself), and the residual
        # in c, compensate's own array: no full-size temporary
        y = base.reconstruct(p_hat, q, key=coding.key, shape=x.shape, dtype=x.dtype,
                             out=out).reshape(-1)
        if ef is not None:
            ef.remember(c.reshape(coding.shape), y, key=coding.key, overwrite=True)
        if not same_memory(y, out):
            out[...] = y
        return
    if not isinstance(base, ElementSummable):  # a tensor the low-rank codec sends uncompressed
        base = _RAW
    scaled = c / coding.world if coding.average else c
    rep = base.summable_encode(scaled, key=coding.key, step=coding.step)
    if ef is not None:
        own = base.summable_decode(rep, shape=x.shape, dtype=x.dtype, key=coding.key,
                                   step=coding.step).reshape(-1)
        ef.remember(c.reshape(coding.shape), own * coding.world if coding.average else own,
                    key=coding.key)
    _sum(rep, base.summable_add, ctx, opts, algorithm)
    base.summable_decode(rep, shape=x.shape, dtype=x.dtype, key=coding.key, step=coding.step,
                         out=out)
