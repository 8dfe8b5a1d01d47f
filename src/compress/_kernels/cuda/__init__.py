"""Numba CUDA kernels behind the codecs' device path (private).

These are the device twins of the host kernels one directory up. They are imported only when a codec
meets a device array, so ``import compress`` never touches CUDA. They share the host kernels'
per-element arithmetic: the scalar functions there (the counter-based RNG,
:func:`~compress._kernels.floats.to_f16_word`, :func:`~compress._kernels.quant.level_code`, ...) are
compiled a second time as CUDA device functions by :func:`device_twin`, so host and device compute the
same bits from one source. Everything runs on a real GPU, or on the CPU under Numba's simulator
(``NUMBA_ENABLE_CUDASIM=1``), which is how CI tests it.

Launch shape: 1-D blocks of :data:`THREADS` threads. Element-wise kernels use grid-stride loops over at
most :data:`MAX_BLOCKS` blocks. Reductions are deterministic: every block reduces its part in shared
memory in a fixed order and writes one partial, and the host adds the partials in order. Kernels take
device arrays (CuPy, Numba, or anything with ``__cuda_array_interface__``) and are launched by
:func:`launch` on the stream of the :class:`compress._backends.cuda.Device` that owns the arrays.
"""

from __future__ import annotations

import types
import warnings

from numba import config, cuda

__all__ = ["THREADS", "MAX_BLOCKS", "blocks", "launch", "device_twin"]

#: threads per block (a power of two: the shared-memory reductions halve it). The simulator runs each
#: thread as a Python thread, so it gets small blocks (cheaper, and its tests cross tile boundaries at
#: small sizes); the arithmetic does not depend on the block size.
THREADS = 32 if config.ENABLE_CUDASIM else 256
#: cap on the grid of grid-stride kernels (enough to fill any current GPU several times over)
MAX_BLOCKS = 4 if config.ENABLE_CUDASIM else 4096


def blocks(n: int) -> int:
    """Blocks for ``n`` work items: one item per thread, capped at :data:`MAX_BLOCKS`, at least 1."""
    return max(1, min(MAX_BLOCKS, -(-int(n) // THREADS)))


def launch(kernel, nblocks: int, stream, *args) -> None:
    """``kernel[nblocks, THREADS, stream](*args)``, without Numba's low-occupancy warning (small
    tensors get small grids on purpose). numba-cuda puts terminal bold codes before the words, so the
    filter matches them anywhere in the message."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Grid size", category=Warning)
        kernel[nblocks, THREADS, stream](*args)


def device_twin(host_fn, **deps):
    """A CUDA device function compiled from the Python source of the ``@njit`` function ``host_fn``.

    ``deps`` name the device twins of the host functions that ``host_fn`` calls: the twin sees the
    host module's globals with those names replaced, so its calls land on device code.
    """
    py = host_fn.py_func
    env = dict(py.__globals__)
    env.update(deps)
    clone = types.FunctionType(py.__code__, env, py.__name__, py.__defaults__, py.__closure__)
    return cuda.jit(device=True)(clone)
