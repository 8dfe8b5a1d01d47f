"""Tensor (model) parallelism: Megatron-LM's split of an MLP block over the ranks of one axis.

Megatron-LM (Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models
Using Model Parallelism", section 3) splits the two linear layers of an MLP block
``y = relu(x A) B`` over the ``T`` ranks of the tensor-parallel (``tp``) axis:

- the first, :class:`ColumnParallelLinear`, by **columns**: rank ``r`` holds ``A[:, r]`` (the
  ``r``-th of ``T`` equal blocks of output columns) and its part of the bias, and computes its
  block of the hidden activations, ``h_r = relu(x A_r + a_r)``, from the whole input ``x``
  (the same on every rank of the axis); the nonlinearity is elementwise, so no rank needs
  another's block;
- the second, :class:`RowParallelLinear`, by **rows**: rank ``r`` holds ``B_r`` (the rows that
  meet ``h_r``) and computes the partial product ``h_r B_r``; the output is their sum,
  ``y = sum_r h_r B_r + b``, one allreduce, the bias added once after it.

The paper names the two conjugate operators ``f`` and ``g``: ``f`` (before the column layer) is
the identity in forward and an allreduce in backward, ``g`` (after the row layer) an allreduce
in forward and the identity in backward. Backward therefore runs without communication inside
the block, except ``f``'s: the column layer's input gradient ``dx = sum_r dh_r A_r^T`` is a sum
of partial products too, one allreduce; the row layer's input gradient ``dh_r = dy B_r^T`` and
every weight gradient are local. (The first block of a network needs no input gradient:
``backward(..., input_grad=False)`` skips ``f``'s allreduce.)

**Cost per block and micro-batch** of ``B`` samples and model width ``d`` (the block's input and
output width): two allreduces of ``B x d`` activations (one in forward, one in backward), each
``2 (T-1)/T * B d * 4`` bytes sent per rank by the ring algorithm; the compute per rank is
``1/T`` of the unsplit block's. The weights are not communicated: data parallelism's allreduce
of the gradients (over the ``dp`` axis) carries ``1/T`` of each split block's.

**Initialisation.** Every layer is built from the *whole* weight (given, or drawn from
``default_rng(seed)`` as the unsplit layer of :class:`collectives.sgd.model.MLP` draws it: He
initialisation) and keeps its slice, so the shards concatenate to the unsplit layer's weights
bit for bit, and a split model starts as the one-process model seeded the same way.

**Results.** With ``T = 1`` every bit is the unsplit layer's. The column layer's output and every
weight gradient are the unsplit layer's slices, computed as smaller matrix products (equal to
the BLAS's rounding). The row layer's output and the column layer's input gradient are sums of
``T`` partial products taken in another order than one matrix product takes them: equal to the
unsplit layer's to float32 rounding (docs/parallelism.md states the tolerance the tests use),
and bitwise identical on every rank of the axis (the library's allreduce gives every rank the
same bits), so everything after them (the replicated layers, the loss) is too.

**Names.** PyTorch's tensor-parallel styles ``ColwiseParallel`` and ``RowwiseParallel``
(``torch.distributed.tensor.parallel``) and Megatron's ``ColumnParallelLinear`` and
``RowParallelLinear`` (``megatron.core.tensor_parallel``) are these two layers; the names here
are Megatron's, as they are classes that hold their shard. Megatron's ``gather_output=False``
and ``input_is_parallel=True`` are the only modes (the MLP block's); weights are stored
``(in, out)`` as :class:`collectives.sgd.model.MLP` stores them (``x @ W``), not ``(out, in)``
as ``torch.nn.Linear``.

**Checks.** The constructors check their arguments on every rank of the axis and agree on the
verdict (``_runtime.blocking.construct``): a width that ``T`` does not divide, or ranks that
disagree on the shapes, raise the same ``ValueError`` on every rank before any message.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from .._runtime.blocking import construct
from ..api import allreduce
from ..mesh.mesh import Mesh
from ..options import Options

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "he_init", "tp_comm", "check_split"]


def he_init(fan_in: int, fan_out: int, rng: np.random.Generator) -> np.ndarray:
    """The unsplit layer's ``(fan_in, fan_out)`` float32 weight as
    :class:`collectives.sgd.model.MLP` draws it (He et al. 2015: variance ``2 / fan_in``)."""
    return rng.standard_normal((fan_in, fan_out), dtype=np.float32) * \
        np.float32(np.sqrt(2.0 / fan_in))


def tp_comm(comm: MPI.Comm | Mesh | None, axis: str = "tp") -> MPI.Comm:
    """The communicator of the tensor-parallel axis: ``comm`` itself, or ``mesh.comm(axis)``
    of a :class:`collectives.Mesh` (None: ``COMM_WORLD``)."""
    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, Mesh):
        return comm.comm(axis)
    return comm


class _ParallelLinear:
    """What both layers share: the shard's parameters and gradients, the checks, the
    allreduce. ``split`` names the split dimension of the ``(in, out)`` weight (1: columns,
    0: rows)."""

    split = 1
    name = "ParallelLinear"

    def __init__(self, in_features: int, out_features: int,
                 comm: MPI.Comm | Mesh | None = None, *, axis: str = "tp",
                 weight: np.ndarray | None = None, bias: np.ndarray | None = None,
                 seed: int = 0, algorithm: str = "ring", options: Options | None = None) -> None:
        self.comm = tp_comm(comm, axis)
        self.algorithm, self.options = algorithm, options
        size = self.comm.size

        def check() -> tuple[None, dict[str, Any]]:
            check_split(self.name, in_features, out_features, size, self.split, weight, bias)
            return None, {"in": in_features, "out": out_features, "algorithm": algorithm}

        construct(self.name, self.comm, options, check)  # the same error on every rank
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.tp_size, self.tp_rank = size, self.comm.rank
        full_w = he_init(self.in_features, self.out_features, np.random.default_rng(seed)) \
            if weight is None else np.asarray(weight, dtype=np.float32)
        full_b = np.zeros(self.out_features, np.float32) if bias is None else \
            np.asarray(bias, dtype=np.float32)
        #: this rank's block of the split dimension
        width = (self.in_features, self.out_features)[self.split] // size
        self.block = slice(self.tp_rank * width, (self.tp_rank + 1) * width)
        w = full_w[:, self.block] if self.split == 1 else full_w[self.block]
        b = full_b[self.block] if self.split == 1 else full_b
        self.weight, self.bias = np.ascontiguousarray(w), b.copy()
        self.weight_grad = np.zeros_like(self.weight)
        self.bias_grad = np.zeros_like(self.bias)
        self._input: np.ndarray | None = None
        #: statistics: the allreduces' wall seconds and the elements they reduced
        self.comm_seconds, self.comm_elements = 0.0, 0

    def bind(self, weight: np.ndarray, bias: np.ndarray, weight_grad: np.ndarray,
             bias_grad: np.ndarray) -> None:
        """Keep the parameters (copied in) and gradients in the given arrays from now on (views
        of a trainer's fusion buffers)."""
        weight[...] = self.weight
        bias[...] = self.bias
        self.weight, self.bias = weight, bias
        self.weight_grad, self.bias_grad = weight_grad, bias_grad

    def _weight_gradients(self, dy: np.ndarray) -> None:
        """The weight's and the bias's gradients from the input the forward stored (which is
        then dropped) and the output gradient ``dy``."""
        x, self._input = self._input, None
        if x is None:
            raise RuntimeError(f"{self.name}.backward: no forward to take the gradient of")
        np.matmul(x.T, dy, out=self.weight_grad)
        dy.sum(axis=0, out=self.bias_grad)

    def _allreduce(self, x: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        allreduce(x, out=x, algorithm=self.algorithm, comm=self.comm, options=self.options)
        self.comm_seconds += time.perf_counter() - t0
        self.comm_elements += x.size
        return x

    def __repr__(self) -> str:
        return (f"{self.name}({self.in_features}, {self.out_features}; shard "
                f"{self.weight.shape} of rank {self.tp_rank}/{self.tp_size})")


class ColumnParallelLinear(_ParallelLinear):
    """``x @ A + a`` with ``A``'s output columns split over the axis (module docstring):
    ``forward(x)`` takes the whole input and returns this rank's block of the output columns
    (``out_features / T`` of them) without communication; ``backward(dy_r)`` takes the
    gradient of that block, stores the weight and bias gradients and returns the whole input
    gradient, summed over the axis by one allreduce (Megatron's ``f``).

    PyTorch's ``ColwiseParallel()`` with the output left sharded; Megatron's
    ``ColumnParallelLinear(gather_output=False)``.

    Parameters
    ----------
    in_features, out_features
        The unsplit layer's widths; ``T`` (the axis size) must divide ``out_features``.
    comm
        The tensor-parallel communicator, or a :class:`collectives.Mesh` (its axis ``axis``).
    weight, bias
        The unsplit layer's ``(in, out)`` weight and ``(out,)`` bias, the same on every rank
        (default: He initialisation from ``default_rng(seed)``, zero bias).
    algorithm
        The allreduce algorithm (a name in :data:`collectives.ALGORITHMS`).
    """

    split = 1
    name = "ColumnParallelLinear"

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._input = x
        return x @ self.weight + self.bias

    def backward(self, dy: np.ndarray, input_grad: bool = True) -> np.ndarray | None:
        self._weight_gradients(dy)
        if not input_grad:
            return None
        return self._allreduce(dy @ self.weight.T)


class RowParallelLinear(_ParallelLinear):
    """``h @ B + b`` with ``B``'s input rows split over the axis (module docstring):
    ``forward(h_r)`` takes this rank's block of the input columns (``in_features / T``) and
    returns the whole output, the partial products summed by one allreduce (Megatron's ``g``),
    then the bias added; ``backward(dy)`` takes the whole output gradient (the same on every
    rank), stores the gradients and returns this rank's block of the input gradient, without
    communication.

    PyTorch's ``RowwiseParallel()`` with a sharded input; Megatron's
    ``RowParallelLinear(input_is_parallel=True)``.

    Parameters
    ----------
    in_features, out_features
        The unsplit layer's widths; ``T`` must divide ``in_features``.
    comm, weight, bias, seed, algorithm
        As :class:`ColumnParallelLinear`'s (the bias is whole on every rank).
    """

    split = 0
    name = "RowParallelLinear"

    def forward(self, h: np.ndarray) -> np.ndarray:
        self._input = h
        y = self._allreduce(h @ self.weight)
        y += self.bias
        return y

    def backward(self, dy: np.ndarray, input_grad: bool = True) -> np.ndarray | None:
        self._weight_gradients(dy)
        return dy @ self.weight.T if input_grad else None


def check_split(name: str, n_in: object, n_out: object, size: int, split: int,
                weight: object = None, bias: object = None) -> None:
    """The error of bad layer arguments (the same on every rank that passes the same ones): the
    widths, the split dimension (1: ``out``, 0: ``in``) a multiple of the axis ``size``, the
    unsplit ``(in, out)`` weight's and ``(out,)`` bias's shapes."""
    for label, v in (("in_features", n_in), ("out_features", n_out)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: {label} must be a positive int, got {v!r}")
    width = (n_in, n_out)[split]
    if width % size:
        raise ValueError(f"{name}: the tensor-parallel size {size} does not divide "
                         f"{('in_features', 'out_features')[split]} = {width}; choose a width "
                         f"that is a multiple of {size}, or another tensor-parallel size")
    if weight is not None and np.shape(weight) != (n_in, n_out):
        raise ValueError(f"{name}: weight must be the unsplit ({n_in}, {n_out}) array (in, out), "
                         f"got shape {np.shape(weight)}")
    if bias is not None and np.shape(bias) != (n_out,):
        raise ValueError(f"{name}: bias must be the unsplit ({n_out},) array, got shape "
                         f"{np.shape(bias)}")
