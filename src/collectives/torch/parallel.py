"""Tensor-parallel linear layers for PyTorch: Megatron-LM's MLP split on a mesh axis.

The same split as :mod:`collectives.parallel.tensor` (its docstring has the method and the cost),
as ``torch.nn.Module`` objects whose autograd runs the allreduces: :class:`ColumnParallelLinear`
holds the rows of ``nn.Linear``'s ``(out, in)`` weight that give its block of output features,
and sums its input gradient over the axis in backward (Megatron's ``f``: :class:`_CopyToAxis`);
:class:`RowParallelLinear` holds the columns that meet its block of input features, and sums its
partial outputs in forward (Megatron's ``g``: :class:`_ReduceFromAxis`), adding the bias once
after the sum. Between them an elementwise function (``relu``, ``gelu``) runs on each rank's
block, so ``RowParallelLinear(ColumnParallelLinear(x).relu())`` is ``B(relu(A x))`` with two
allreduces per step, the library's (``collectives.allreduce`` on the tensors, any algorithm).

PyTorch's ``parallelize_module(m, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})``
makes the same pair out of DTensors; these are plain modules over an MPI communicator (a
:class:`collectives.Mesh` and an axis name, or the axis's communicator), as Megatron's
``ColumnParallelLinear(gather_output=False)`` and ``RowParallelLinear(input_is_parallel=True)``
are over a process group. :meth:`ColumnParallelLinear.from_linear` splits an existing
``nn.Linear``; the constructor builds one with the current random state and splits it, so
ranks seeded alike (``torch.manual_seed``) hold the shards of the layer one process would build.
CPU tensors; ``import collectives`` never imports this module (it needs torch).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn

from .. import api
from .._runtime.blocking import construct
from ..mesh.mesh import Mesh
from ..parallel.tensor import check_split, tp_comm

__all__ = ["ColumnParallelLinear", "RowParallelLinear"]


def _summed(x: torch.Tensor, comm: MPI.Comm, algorithm: str) -> torch.Tensor:
    """A new tensor: ``x`` summed over ``comm`` by the library's allreduce."""
    out = x.detach().contiguous().clone()
    return api.allreduce(out, out=out, algorithm=algorithm, comm=comm)


class _CopyToAxis(torch.autograd.Function):
    """Megatron's ``f``: the identity in forward, an allreduce of the gradient in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: MPI.Comm, algorithm: str) -> torch.Tensor:
        ctx.comm, ctx.algorithm = comm, algorithm
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return _summed(grad, ctx.comm, ctx.algorithm), None, None


class _ReduceFromAxis(torch.autograd.Function):
    """Megatron's ``g``: an allreduce in forward, the identity in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: MPI.Comm, algorithm: str) -> torch.Tensor:
        return _summed(x, comm, algorithm)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None, None


class _ParallelLinear(nn.Module):
    """The shard of an ``nn.Linear`` split along ``split`` of its ``(out, in)`` weight (0: the
    output features, 1: the input features)."""

    split = 0
    name = "ParallelLinear"

    def __init__(self, in_features: int, out_features: int,
                 comm: MPI.Comm | Mesh | None = None, bias: bool = True, *, axis: str = "tp",
                 algorithm: str = "ring", linear: nn.Linear | None = None,
                 options: Any = None) -> None:
        super().__init__()
        self.comm = tp_comm(comm, axis)
        self.algorithm = algorithm
        size = self.comm.size

        def check() -> tuple[None, dict[str, Any]]:
            # in the NumPy layer's terms: its (in, out) weight splits on the other dimension
            check_split(self.name, in_features, out_features, size, 1 - self.split)
            if linear is not None and (linear.in_features, linear.out_features) != \
                    (in_features, out_features):
                raise ValueError(f"{self.name}: the linear layer is ({linear.in_features} -> "
                                 f"{linear.out_features}), not ({in_features} -> "
                                 f"{out_features})")
            return None, {"in": in_features, "out": out_features, "bias": bool(bias),
                          "algorithm": algorithm}

        construct(self.name, self.comm, options, check)  # the same error on every rank
        full = nn.Linear(in_features, out_features, bias=bias) if linear is None else linear
        self.in_features, self.out_features = in_features, out_features
        self.tp_size, self.tp_rank = size, self.comm.rank
        width = (out_features, in_features)[self.split] // size
        block = slice(self.tp_rank * width, (self.tp_rank + 1) * width)
        with torch.no_grad():
            w = full.weight[block] if self.split == 0 else full.weight[:, block]
            self.weight = nn.Parameter(w.detach().clone().contiguous())
            b = None if full.bias is None else (full.bias[block] if self.split == 0
                                                else full.bias)
            self.bias = None if b is None else nn.Parameter(b.detach().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear, comm: MPI.Comm | Mesh | None = None, *,
                    axis: str = "tp", algorithm: str = "ring") -> "_ParallelLinear":
        """This rank's shard of ``linear`` (the same layer on every rank of the axis)."""
        return cls(linear.in_features, linear.out_features, comm, linear.bias is not None,
                   axis=axis, algorithm=algorithm, linear=linear)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"shard={tuple(self.weight.shape)} of rank {self.tp_rank}/{self.tp_size}")


class ColumnParallelLinear(_ParallelLinear):
    """``nn.Linear(in, out)`` split by output features over the axis (PyTorch's
    ``ColwiseParallel``): takes the whole input (the same on every rank), returns this rank's
    ``out / T`` output features; its backward sums the input gradient over the axis.

    Parameters
    ----------
    in_features, out_features
        The unsplit layer's; the axis size ``T`` must divide ``out_features``.
    comm
        The axis's communicator, or a :class:`collectives.Mesh` (its axis ``axis``).
    bias
        Whether the layer has a bias (its block of output features).
    algorithm
        The allreduce algorithm, a name in :data:`collectives.ALGORITHMS`.
    linear
        The unsplit layer to take the shard of (default: a new ``nn.Linear`` drawn from the
        current random state; :meth:`from_linear`).
    """

    split = 0
    name = "ColumnParallelLinear"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_CopyToAxis.apply(x, self.comm, self.algorithm), self.weight, self.bias)


class RowParallelLinear(_ParallelLinear):
    """``nn.Linear(in, out)`` split by input features over the axis (PyTorch's
    ``RowwiseParallel``): takes this rank's ``in / T`` input features (a
    :class:`ColumnParallelLinear`'s output), returns the whole output, the partial products
    summed over the axis and the bias (whole on every rank) added once. Parameters as
    :class:`ColumnParallelLinear`'s; ``T`` must divide ``in_features``."""

    split = 1
    name = "RowParallelLinear"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _ReduceFromAxis.apply(F.linear(x, self.weight), self.comm, self.algorithm)
        return y if self.bias is None else y + self.bias
