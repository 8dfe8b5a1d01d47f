"""Non-temporal ("streaming") stores for Numba kernels that write a tensor larger than the
caches: compress's fused memories and collectives' aggregation of sparse payloads use them.
Importing this module imports Numba (``import compress`` does not import it).

A plain store to a line that is not in the cache first reads the line from memory (a write
allocate), so computing ``c = x + e`` into a third buffer moves four tensors' worth of bytes:
read ``x``, read ``e``, read ``c``, write ``c``. A non-temporal store writes whole lines past the
cache without reading them: three tensors' worth, what a memory copy moves. The fused kernels
(:mod:`compress._kernels.fused`) compute a block of 64 elements into a small buffer that stays in L1 and hand it
to :func:`stream_block`, which writes it to the tensor with 64-byte vector stores marked
``!nontemporal`` (LLVM emits ``vmovntps``/``vmovntpd`` on x86, and ordinary stores where a
target has no such hint). The bits written are the buffer's: only the path to memory changes.

The destination of a block must be 64-byte aligned (the caller starts its blocks at the first
aligned element and handles the elements before it with plain stores). Non-temporal stores are
weakly ordered: :func:`store_fence` (a sequentially consistent fence: ``mfence`` on x86) ends a
kernel that used them, so another thread that later reads the tensor sees every store.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["LINE", "BLOCK", "STREAM_MIN_BYTES", "streaming", "stream_block", "store_fence"]

#: Bytes per vector store and the alignment a block's destination needs.
LINE = 64
#: Elements per :func:`stream_block` (a whole number of lines in every float format).
BLOCK = 64
#: Outputs smaller than this are written with plain stores: they fit in the caches, where the
#: next kernel (the residual's update at the sent indices, the next step) finds them.
STREAM_MIN_BYTES = 8 << 20


def streaming(out: np.ndarray) -> tuple[int, bool]:
    """``(head, stream)`` for a kernel writing the flat ``out``: stream past the caches from
    element ``head`` (the first 64-byte aligned one) when ``out`` is large; else plain stores."""
    addr = out.ctypes.data
    if out.nbytes < STREAM_MIN_BYTES or addr % out.itemsize:
        return 0, False
    return (-addr % LINE) // out.itemsize, True


@intrinsic
def stream_block(typingctx, src, dst, lo):
    """``dst[lo:lo + BLOCK] = src[:BLOCK]`` (contiguous arrays of one dtype), with non-temporal
    64-byte stores; ``dst`` at ``lo`` must be 64-byte aligned."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array)
            and src.dtype == dst.dtype and isinstance(lo, types.Integer)):
        return None
    itemsize = src.dtype.bitwidth // 8
    lanes = LINE // itemsize
    sig = types.void(src, dst, lo)

    def codegen(context, builder, sig, args):
        src_ty, dst_ty, lo_ty = sig.args
        s = context.make_array(src_ty)(context, builder, args[0])
        d = context.make_array(dst_ty)(context, builder, args[1])
        base = context.cast(builder, args[2], lo_ty, types.intp)
        vty = ir.VectorType(context.get_value_type(dst_ty.dtype), lanes)
        hint = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        for q in range(BLOCK * itemsize // LINE):
            at = ir.Constant(ir.IntType(base.type.width), q * lanes)
            sp = cgutils.get_item_pointer(context, builder, src_ty, s, [at], wraparound=False)
            dp = cgutils.get_item_pointer(context, builder, dst_ty, d, [builder.add(base, at)],
                                          wraparound=False)
            v = builder.load(builder.bitcast(sp, vty.as_pointer()), align=itemsize)
            store = builder.store(v, builder.bitcast(dp, vty.as_pointer()), align=LINE)
            store.set_metadata("nontemporal", hint)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_fence(typingctx):
    """A sequentially consistent fence: every store before it, non-temporal ones included, is
    visible before any memory access after it."""
    sig = types.void()

    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen
