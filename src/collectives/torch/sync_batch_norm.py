"""Horovod's ``hvd.SyncBatchNorm``: batch norm whose batch statistics are those of every rank's
samples together, as if the process set's local batches were one batch.

How it works, for an input ``x`` of shape ``(N, C, *)`` on each rank (``N`` may differ from rank
to rank) in training mode:

1. *Local statistics.* Each rank computes, per channel ``c``, its sample count ``n`` (``N``
   times the product of the trailing dimensions), its ``mean`` and ``m2``, the sum of squared
   deviations from that mean, in float64.
2. *Allgather* (one call, a ``(1, 3, C)`` float64 tensor of ``[n, mean, m2]``) over the process
   set, then Chan, Golub and LeVeque's pairwise combination ("Updating formulae and a pairwise
   algorithm for computing sample variances", 1979) on every rank: ``count = sum(n_i)``,
   ``mean = sum(n_i * mean_i) / count``, ``m2 = sum(m2_i + n_i * (mean_i - mean)**2)``. Unlike
   sums of squares, this loses nothing when the mean is large against the spread.
3. *Normalize* with the global statistics: ``xhat = (x - mean) / sqrt(m2 / count + eps)``,
   ``y = weight * xhat + bias``; the running statistics move towards ``mean`` and the unbiased
   variance ``m2 / (count - 1)`` (``momentum``, or a cumulative average with ``momentum=None``),
   identically on every rank.
4. *Backward.* ``y`` on every rank depends on every rank's ``x`` through ``mean`` and ``var``, so
   the input gradient needs two per-channel sums over the whole batch: ``sum(dy)`` and
   ``sum(dy * xhat)``, one Sum allreduce of a ``(2, C)`` float64 tensor. Then
   ``dx = weight / sqrt(var + eps) * (dy - sum(dy) / count - xhat * sum(dy * xhat) / count)``.
   The gradients of ``weight`` and ``bias`` are this rank's own sums, not reduced: as in
   Horovod, the optimizer's allreduce (:func:`~collectives.torch.DistributedOptimizer`) sums
   them with the other ranks' like any parameter's gradient.

The collectives are :func:`~collectives.torch.mpi_ops.allgather` and
:func:`~collectives.torch.mpi_ops.allreduce` on the process set, so a rank with a different
number of channels raises :class:`~collectives.torch.HorovodInternalError` on every rank.

With one rank in the set, or where the running statistics are used (eval mode with
``track_running_stats=True``), it is plain ``torch.nn.functional.batch_norm``. Where batch
statistics are used in eval mode (``track_running_stats=False``) they are the set's, as in
Horovod (``torch.nn.SyncBatchNorm`` uses local ones there). Unlike Horovod's, which calls CUDA
kernels, it runs on any device, CPU included; every rank of the set must call ``forward`` (and
``backward``) together, and a rank with no samples takes part with ``n = 0``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

from .basics import Sum
from .mpi_ops import allgather, allreduce
from .process_sets import ProcessSet, global_process_set

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch norm over the samples of every rank of ``process_set`` (Horovod's
    ``hvd.SyncBatchNorm``); for inputs ``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)``, ...

    Arguments are ``torch.nn.BatchNorm2d``'s (``num_features`` is ``C``), and Horovod's
    ``process_set`` (default: every rank).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_set: ProcessSet = global_process_set) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum  # torch's _BatchNorm.forward
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else factor
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        # torch's rule: running statistics are used in eval mode, updated in training unless
        # track_running_stats is off
        keep = not self.training or self.track_running_stats
        running_mean = self.running_mean if keep else None
        running_var = self.running_var if keep else None
        if not batch_stats or self.process_set.size() == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                batch_stats, factor, self.eps)
        # batch statistics in eval mode only without running statistics: both are None then
        return _SyncBatchNorm.apply(input, self.weight, self.bias, running_mean, running_var,
                                    self.eps, factor, self.process_set)


def _channels_view(x: torch.Tensor, per_channel: torch.Tensor) -> torch.Tensor:
    """``per_channel`` (shape ``(C,)``) shaped to broadcast against ``x`` ``(N, C, *)``."""
    return per_channel.view(1, -1, *([1] * (x.dim() - 2)))


def _global_stats(x: torch.Tensor, process_set: ProcessSet) -> tuple[torch.Tensor, ...]:
    """Steps 1 and 2 of the module's docstring: the set's ``count`` (a float), ``mean`` and
    ``m2`` per channel, float64."""
    dims = [0, *range(2, x.dim())]
    xd = x.detach().to(torch.float64)
    n = x.numel() // x.size(1)
    if n:
        var, mean = torch.var_mean(xd, dim=dims, correction=0)
        m2 = var * n
    else:
        mean = m2 = torch.zeros(x.size(1), dtype=torch.float64, device=x.device)
    local = torch.stack([torch.full_like(mean, float(n)), mean, m2]).unsqueeze(0)
    every = allgather(local.cpu(), process_set=process_set).to(x.device)  # (p, 3, C)
    counts, means, m2s = every[:, 0], every[:, 1], every[:, 2]
    count = counts.sum(0)
    mean = (counts * means).sum(0) / count
    m2 = (m2s + counts * (means - mean) ** 2).sum(0)
    return count[0].item(), mean, m2


class _SyncBatchNorm(torch.autograd.Function):
    """Forward and backward of the module's docstring (steps 3 and 4)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, running_mean: torch.Tensor | None,
                running_var: torch.Tensor | None, eps: float, factor: float,
                process_set: ProcessSet) -> torch.Tensor:
        count, mean, m2 = _global_stats(x, process_set)
        if count <= 1:  # the same on every rank: each has every rank's counts
            raise ValueError("Expected more than 1 value per channel when training, got "
                             f"{int(count)} over the process set's ranks")
        var = m2 / count
        if running_mean is not None:
            running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
        if running_var is not None:
            unbiased = m2 / (count - 1)
            running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        invstd = torch.rsqrt(var + eps)
        work = torch.promote_types(x.dtype, torch.float32)
        xhat = (x.to(work) - _channels_view(x, mean.to(work))) * _channels_view(x, invstd.to(work))
        y = xhat
        if weight is not None:
            y = y * _channels_view(x, weight.to(work))
        if bias is not None:
            y = y + _channels_view(x, bias.to(work))
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.count, ctx.process_set, ctx.has_bias = count, process_set, bias is not None
        ctx.param_dtype = (weight if weight is not None else bias if bias is not None else x).dtype
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        xhat, weight, invstd = ctx.saved_tensors
        dims = [0, *range(2, xhat.dim())]
        dy_w = dy.to(xhat.dtype)
        local = torch.stack([dy_w.sum(dims, dtype=torch.float64),
                             (dy_w * xhat).sum(dims, dtype=torch.float64)])
        grad_weight = local[1].to(ctx.param_dtype) if weight is not None else None
        grad_bias = local[0].to(ctx.param_dtype) if ctx.has_bias else None
        dx = None
        if ctx.needs_input_grad[0]:
            # the sums over every rank's samples (one Sum allreduce of (2, C))
            total = allreduce(local.cpu(), op=Sum, process_set=ctx.process_set).to(dy.device)
            scale = invstd if weight is None else invstd * weight.detach().to(torch.float64)
            mean_dy, mean_dy_xhat = (total / ctx.count).to(xhat.dtype)
            dx = _channels_view(xhat, scale.to(xhat.dtype)) * (
                dy_w - _channels_view(xhat, mean_dy) - xhat * _channels_view(xhat, mean_dy_xhat))
            dx = dx.to(dy.dtype)
        return (dx, grad_weight if ctx.needs_input_grad[1] else None,
                grad_bias if ctx.needs_input_grad[2] else None, None, None, None, None, None)
