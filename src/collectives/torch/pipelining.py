"""Pipeline parallelism for PyTorch modules, with ``torch.distributed.pipelining``'s names.

``PipelineStage(submodule, stage_index, num_stages)`` wraps this rank's part of a model (for
instance a slice of an ``nn.Sequential``); ``ScheduleGPipe(stage, n_microbatches, loss_fn)`` or
``Schedule1F1B(...)`` runs one batch per ``step()``: the first stage passes the batch
(``schedule.step(x)``), the last the target (``schedule.step(target=y, losses=losses)``), the
others nothing (``schedule.step()``), as with PyTorch's classes. The schedules are this
library's action lists (:mod:`collectives.parallel.pipeline`: GPipe, 1F1B), run by its
executor over its point-to-point calls (``collectives.isend``/``irecv`` of the tensors) on an
MPI communicator (``group=``: a ``Mesh.comm("pp")``, or ``COMM_WORLD``) instead of a
torch.distributed process group. So no ``init_process_group`` is needed, and a stage that
raises makes every rank raise (:mod:`collectives.parallel.pipeline.failures`).

As in PyTorch: the batch is cut into ``n_microbatches`` pieces along dimension 0
(``torch.tensor_split``); the last stage computes ``loss_fn(output, target)`` per micro-batch
and backpropagates it; gradients accumulate in the parameters' ``.grad`` over the
micro-batches and are divided by ``n_microbatches`` at the end of the step (``scale_grads``,
PyTorch's default); the optimizer step is the caller's. ``step()`` returns the last stage's
outputs, concatenated (None elsewhere). The shapes of the activations that travel are found on
the first step (every stage runs its module once without gradients on zeros of its input's
shape and tells the next stage its output's shape); later steps must have the same
micro-batch shapes (a message of another size raises ``ValueError`` on its receiver), as
PyTorch's stages keep the shapes of their first step. Where they differ from PyTorch: one
positional tensor flows between stages (no kwargs, no tuples), and there is no
``split_spec``/``pipeline()`` tracer: the user cuts the module.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from mpi4py import MPI

from ..parallel.pipeline import RECV_ACT, Pipeline
from ..pt2pt.messages import recv, send

__all__ = ["PipelineStage", "ScheduleGPipe", "Schedule1F1B"]

#: dtypes of the activations that may travel, by their code in the shape message
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
#: the caller tag of the shape messages (training uses the micro-batch numbers)
_SHAPE_TAG = 1 << 21


class PipelineStage:
    """This rank's part of the model: ``submodule``, stage ``stage_index`` of ``num_stages``.

    ``group`` is the MPI communicator of the pipeline (its rank ``stage_index`` is this stage;
    default ``COMM_WORLD``); ``world`` the communicator of every rank of every pipeline, where a
    failure is told (default ``group``)."""

    def __init__(self, submodule: torch.nn.Module, stage_index: int, num_stages: int,
                 device: torch.device | str | None = None, group: MPI.Comm | None = None,
                 world: MPI.Comm | None = None) -> None:
        group = MPI.COMM_WORLD if group is None else group
        if group.size != num_stages or group.rank != stage_index:
            raise ValueError(f"PipelineStage: stage {stage_index} of {num_stages} on a "
                             f"communicator of {group.size} ranks where this one is rank "
                             f"{group.rank}: the group's rank must be the stage")
        self.submod = submodule
        self.stage_index, self.num_stages = stage_index, num_stages
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.group, self.world = group, world
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        #: per micro-batch: (input shape, input dtype), (output shape, output dtype)
        self.shapes: list[tuple[tuple[tuple[int, ...], torch.dtype],
                                tuple[tuple[int, ...], torch.dtype]]] | None = None

    def _infer(self, chunks: list[torch.Tensor] | None, microbatches: int) -> None:
        """The first step's shapes, stage to stage (module docstring)."""
        if self.is_first:
            ins = [(tuple(c.shape), c.dtype) for c in chunks]
        else:
            head = recv(np.empty(2, np.int64), self.stage_index - 1, tag=_SHAPE_TAG,
                        comm=self.group)
            dims = recv(np.empty(microbatches * int(head[0]), np.int64), self.stage_index - 1,
                        tag=_SHAPE_TAG, comm=self.group).reshape(microbatches, -1)
            ins = [(tuple(int(d) for d in row), _DTYPES[int(head[1])]) for row in dims]
        outs = []
        with torch.no_grad():
            for (shape, dtype), m in zip(ins, range(microbatches)):
                x = chunks[m] if self.is_first else torch.zeros(shape, dtype=dtype,
                                                                device=self.device)
                y = self.submod(x)
                outs.append((tuple(y.shape), y.dtype))
        if not self.is_last:
            ndim = len(outs[0][0])
            if any(len(s) != ndim or d != outs[0][1] or d not in _DTYPES for s, d in outs):
                raise ValueError("PipelineStage: the micro-batches' outputs must share their "
                                 f"number of dimensions and a dtype of {_DTYPES}")
            send(np.array([ndim, _DTYPES.index(outs[0][1])], np.int64), self.stage_index + 1,
                 tag=_SHAPE_TAG, comm=self.group)
            send(np.array([s for s, _ in outs], np.int64).reshape(-1), self.stage_index + 1,
                 tag=_SHAPE_TAG, comm=self.group)
        self.shapes = list(zip(ins, outs))


class _Runner:
    """One step of a stage, as the executor calls it (:class:`collectives.parallel.pipeline.Stage`)."""

    def __init__(self, stage: PipelineStage, chunks, targets, loss_fn) -> None:
        self.stage, self.chunks, self.targets, self.loss_fn = stage, chunks, targets, loss_fn
        self.held: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.losses: dict[int, torch.Tensor] = {}

    def buffer(self, kind: str, m: int) -> torch.Tensor:
        shape, dtype = self.stage.shapes[m][0 if kind == RECV_ACT else 1]
        return torch.empty(shape, dtype=dtype, device=self.stage.device)

    def forward(self, m: int, x: torch.Tensor | None) -> torch.Tensor | None:
        st = self.stage
        if st.is_first:
            x = self.chunks[m]
        else:
            x.requires_grad_(True)
        y = st.submod(x)
        if st.is_last:
            self.outputs[m] = y.detach()
            if self.loss_fn is not None:
                loss = self.loss_fn(y, self.targets[m])
                self.losses[m] = loss.detach()
                y = loss
            self.held[m] = (None if st.is_first else x, y)
            return None
        self.held[m] = (None if st.is_first else x, y)
        return y.detach().contiguous()

    def backward(self, m: int, dy: torch.Tensor | None) -> torch.Tensor | None:
        x, y = self.held.pop(m)
        if dy is None:
            y.backward() if y.dim() == 0 else y.backward(torch.ones_like(y))
        else:
            y.backward(dy)
        return None if x is None else x.grad.contiguous()


class _PipelineSchedule:
    """The schedule named :attr:`name` over ``stage`` (module docstring)."""

    name = ""

    def __init__(self, stage: PipelineStage, n_microbatches: int,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 scale_grads: bool = True) -> None:
        self.stage, self.n_microbatches = stage, n_microbatches
        self.loss_fn, self.scale_grads = loss_fn, scale_grads
        self.pipeline = Pipeline(self.name, n_microbatches, stage.group, world=stage.world)

    def step(self, *args: Any, target: torch.Tensor | None = None,
             losses: list | None = None) -> torch.Tensor | None:
        """One batch through the pipeline (module docstring); collective over the pipeline."""
        st, M = self.stage, self.n_microbatches
        if st.is_first and len(args) != 1:
            raise TypeError("the first stage's step() takes the batch, one tensor")
        chunks = list(torch.tensor_split(args[0], M)) if st.is_first else None
        targets = list(torch.tensor_split(target, M)) if st.is_last and target is not None \
            else None
        if st.is_last and self.loss_fn is not None and targets is None:
            raise TypeError("the last stage's step() takes target= where there is a loss_fn")
        if st.shapes is None:
            st._infer(chunks, M)
        runner = _Runner(st, chunks, targets, self.loss_fn)
        self.pipeline.step(runner)
        if self.scale_grads:
            for p in st.submod.parameters():
                if p.grad is not None:
                    p.grad.div_(M)
        if not st.is_last:
            return None
        if losses is not None:
            losses.extend(runner.losses[m] for m in range(M) if m in runner.losses)
        return torch.cat([runner.outputs[m] for m in range(M)])

    def close(self) -> None:
        """Free the pipeline's communicators (collective)."""
        self.pipeline.close()


class ScheduleGPipe(_PipelineSchedule):
    """GPipe: every micro-batch's forward, then every backward (holds M micro-batches)."""

    name = "gpipe"


class Schedule1F1B(_PipelineSchedule):
    """1F1B (PipeDream-flush): one forward, one backward (holds at most S micro-batches)."""

    name = "1f1b"
