"""Raw addresses as typed memory, and the memory ordering of the round counters (private).

Memory of other processes is reached through raw addresses, turned into typed arrays by
:func:`pointer` (with Numba's ``carray``). Round counters are read with acquire loads and
written with release stores (:func:`load_acquire`, :func:`store_release`): LLVM atomics, so the
compiler neither caches a polled counter nor moves data accesses across it. Non-temporal stores
(:func:`store_streaming`) are weakly ordered: a :func:`fence` comes before any release that
publishes what they wrote.

Element formats: a native dtype is its own format (the kernel arrays take its type); float16,
which Numba cannot type, travels as uint16 with the format token :data:`FLOAT16` (an empty array
of a one-field record dtype); :data:`BYTES` and :data:`WORDS` are the formats of raw bytes and of
control words. The reduction converts float16 at load and store (``arithmetic``); a further
16-bit format (bfloat16) needs one more token, here, and one more branch in each conversion.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["FLOAT16", "BYTES", "WORDS", "is_float16", "pointer", "load_acquire",
           "store_release", "store_streaming", "fence"]

#: Format token of float16 data, stored as uint16 words.
FLOAT16 = np.empty(0, np.dtype([("float16", "<u2")]))
#: Format tokens of raw bytes and of control words.
BYTES = np.empty(0, np.uint8)
WORDS = np.empty(0, np.int64)


def is_float16(token) -> bool:
    """Whether the Numba type ``token`` is that of :data:`FLOAT16` (at typing time)."""
    dtype = getattr(token, "dtype", None)
    return isinstance(dtype, types.Record) and "float16" in dtype.fields


@intrinsic
def pointer(typingctx, addr, token):
    """A typed pointer to ``addr`` for the element format of ``token``."""
    if not isinstance(addr, types.Integer) or not isinstance(token, types.Array):
        return None
    element = types.uint16 if is_float16(token) else token.dtype
    sig = types.CPointer(element)(addr, token)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@intrinsic
def load_acquire(typingctx, addr):
    """The int64 at ``addr``, read with acquire ordering."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.load_atomic(ptr, "acquire", 8)

    return types.int64(addr), codegen


@intrinsic
def store_release(typingctx, addr, value):
    """Write the int64 ``value`` at ``addr`` with release ordering."""
    if not isinstance(addr, types.Integer) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        val = context.cast(builder, args[1], signature.args[1], types.int64)
        builder.store_atomic(val, ptr, "release", 8)
        return context.get_dummy_value()

    return types.void(addr, value), codegen


@intrinsic
def store_streaming(typingctx, addr, value):
    """Write the int64 ``value`` at ``addr`` with a non-temporal store (no read for ownership,
    bypassing the caches); weakly ordered, so :func:`fence` before any release."""
    if not isinstance(addr, types.Integer) or value != types.int64:
        return None

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        store = builder.store(args[1], ptr, align=8)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(addr, value), codegen


@intrinsic
def fence(typingctx):
    """A full memory fence (orders non-temporal stores too)."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen
