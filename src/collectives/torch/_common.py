"""What the optimizer and the DDP hook share: codec states and starting one bucket's allreduce.

A bucket is a contiguous tensor (a fusion buffer, or DDP's ``GradBucket.buffer()``); its
allreduce is a non-blocking request on the communicator's progress engine
(:mod:`collectives.engine.nonblocking`), dense or compressed, reducing the tensor in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from compress import Codec
from compress.protocols import LowRankSummable, Memory

from ..engine import nonblocking
from ..compressed.state import CompressionState

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "codec_of", "make_state", "start", "low_rank", "state_tensors",
           "load_state_tensors"]


class Compressor:
    """Horovod's compressor interface: ``compress(tensor) -> (tensor, ctx)`` and
    ``decompress(tensor, ctx) -> tensor``, static methods of a class that is passed itself
    (``compression=Compression.fp16``). :attr:`spec` is the codec of ``compress`` that does the
    same work inside the collectives (None: no codec)."""

    spec: str | None = None

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    spec = None

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 (round to nearest even, as the ``fp16`` codec
    of ``compress`` that the collectives use for it); other dtypes as they are."""

    spec = "fp16"

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None or tensor.dtype == ctx else tensor.to(ctx)


class Compression:
    """Horovod's ``hvd.Compression``: ``compression=Compression.fp16`` is ``codec="fp16"``,
    ``Compression.none`` no codec. Every codec of ``compress`` is a spec away:
    ``codec="topk:ratio=0.01"``."""

    none = NoneCompressor
    fp16 = FP16Compressor


def _compressor(x: Any) -> type[Compressor] | None:
    if isinstance(x, type) and issubclass(x, Compressor):
        return x
    return type(x) if isinstance(x, Compressor) else None


def codec_of(codec: Any, compression: Any) -> Any:
    """The codec of a call given Horovod's ``compression=`` and/or our ``codec=``."""
    ours = _compressor(compression)
    if ours is not None and ours.spec is None and ours.compress is NoneCompressor.compress:
        compression = None
    elif ours is not None and ours.spec is not None:
        compression = ours.spec
    if compression is None:
        return codec
    if codec is not None:
        raise ValueError("pass codec= or Horovod's compression=, not both")
    if isinstance(compression, (str, Codec, Memory, CompressionState)):
        return compression
    raise TypeError("compression= takes collectives.torch.Compression.none or .fp16 (Horovod's "
                    "names); for any other codec pass codec=, e.g. codec='fp16' or "
                    f"codec='topk:ratio=0.01' (got {compression!r})")


def make_state(codec: Any, error_feedback: bool | None, start_step: int | None = None, *,
               rank: int) -> CompressionState | None:
    """The compression state of ``codec`` (None, a spec such as ``"topk:ratio=0.01"``, a codec,
    a memory around one, or a ``CompressionState``); a spec's is
    ``CompressionState.from_spec(spec, rank=rank)`` (seed 0). ``error_feedback``: wrap the codec
    in ``compress.ErrorFeedback`` (True), keep it bare (False), or do so where the codec needs
    it (None). ``start_step``: the state's (dense before it), if given."""
    if codec is None:
        if error_feedback or start_step:
            raise ValueError("error_feedback and start_step need a codec")
        return None
    if isinstance(codec, str):
        return CompressionState.from_spec(codec, rank=rank, error_feedback=error_feedback,
                                          start_step=0 if start_step is None else start_step)
    if not isinstance(codec, (Codec, Memory, CompressionState)):
        raise TypeError(f"codec must be None, a codec spec, a compress codec, a memory or a "
                        f"CompressionState, got {type(codec).__name__}")
    state = CompressionState.of(codec, error_feedback=error_feedback)
    if start_step is not None:
        if not isinstance(start_step, int) or isinstance(start_step, bool) or start_step < 0:
            raise ValueError(f"start_step must be a non-negative integer, got {start_step!r}")
        state.start_step = start_step
    return state


def low_rank(state: CompressionState | None) -> bool:
    """Whether the codec compresses matrices (PowerSGD): each tensor then travels alone, in its
    matrix shape, instead of fused into a flat bucket."""
    return state is not None and isinstance(state.codec, LowRankSummable)


def start(buf: torch.Tensor, state: CompressionState | None, *, op: str, algorithm: str,
          strategy: str, comm: Any, key: str, step: int, name: str | None) -> Any:
    """Start the in-place allreduce of ``buf`` on the engine; returns the request."""
    if state is None:
        return nonblocking.iallreduce(buf, out=buf, op=op, algorithm=algorithm, comm=comm,
                                      name=name)
    return nonblocking.icompressed_allreduce(buf, state, out=buf, op=op, strategy=strategy,
                                             comm=comm, key=key, step=step, algorithm=algorithm,
                                             name=name)


def state_tensors(state: CompressionState | None) -> dict[str, torch.Tensor]:
    """The codec state (residuals, PowerSGD matrices, step) as CPU tensors, for ``torch.save``
    (whose default ``weights_only`` loading takes tensors, not NumPy arrays)."""
    if state is None:
        return {}
    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in state.state_dict().items()}


def load_state_tensors(state: CompressionState | None, tensors: dict[str, torch.Tensor]) -> None:
    """Restore what :func:`state_tensors` gave."""
    if state is None:
        if tensors:
            raise ValueError("the checkpoint has codec state but this run has no codec")
        return
    state.load_state_dict({k: v.detach().cpu().numpy() for k, v in tensors.items()})
