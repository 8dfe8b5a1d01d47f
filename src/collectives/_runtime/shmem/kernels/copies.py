"""Byte copies between raw addresses, and reads of another process's memory (private).

:func:`copy` is a plain byte loop; :func:`copy_streaming` writes the 8-byte-aligned middle with
non-temporal stores, for results too long to stay in cache.
:func:`cma_read` copies from another rank's private memory by cross-memory attach
(``process_vm_readv``), calling the C library's function through its address, which the team
records in its table at creation (``layout.T_READV``, ``T_ERRNO``).
"""

from __future__ import annotations

from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from .. import layout as L
from . import NJIT
from .memory import BYTES, WORDS, pointer, store_streaming

__all__ = ["copy", "copy_streaming", "cma_read"]


@intrinsic
def _readv(typingctx, fn, pid, local, remote):
    """``process_vm_readv(pid, local, 1, remote, 1, 0)`` through the C function at address
    ``fn`` (passed in, not a constant, so that the kernels stay cacheable); ``local`` and
    ``remote`` are addresses of one ``struct iovec`` each. Returns its result."""
    if not all(isinstance(a, types.Integer) for a in (fn, pid, local, remote)):
        return None

    def codegen(context, builder, signature, args):
        i64, i32, ptr = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(i64, [i32, ptr, i64, ptr, i64, i64])
        func = builder.inttoptr(args[0], fnty.as_pointer())
        pid = builder.trunc(context.cast(builder, args[1], signature.args[1], types.int64), i32)
        one, zero = ir.Constant(i64, 1), ir.Constant(i64, 0)
        return builder.call(func, [pid, builder.inttoptr(args[2], ptr), one,
                                   builder.inttoptr(args[3], ptr), one, zero])

    return types.int64(fn, pid, local, remote), codegen


@intrinsic
def _errno(typingctx, fn):
    """The calling thread's ``errno``, through ``__errno_location`` at address ``fn``."""
    if not isinstance(fn, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32).as_pointer(), [])
        func = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.sext(builder.load(builder.call(func, [])), ir.IntType(64))

    return types.int64(fn), codegen


@njit(**NJIT)
def copy(dst, src, nbytes):  # pragma: no cover - compiled
    """Copy ``nbytes`` from address ``src`` to address ``dst``."""
    if nbytes > 0:
        d = carray(pointer(dst, BYTES), nbytes)
        s = carray(pointer(src, BYTES), nbytes)
        for i in range(nbytes):
            d[i] = s[i]


@njit(**NJIT)
def copy_streaming(dst, src, nbytes):  # pragma: no cover - compiled
    """Like :func:`copy`, with non-temporal stores for the 8-byte-aligned middle (a fence must
    follow before the result is published)."""
    head = min(nbytes, (-dst) % 8)
    copy(dst, src, head)
    words = (nbytes - head) // 8
    s = carray(pointer(src + head, WORDS), words)
    for i in range(words):
        store_streaming(dst + head + i * 8, s[i])
    done = head + words * 8
    copy(dst + done, src + done, nbytes - done)


@njit(**NJIT)
def cma_read(tab, q, dst, src, nbytes):  # pragma: no cover - compiled
    """Copy ``nbytes`` at address ``src`` of rank q's process to ``dst`` of this one
    (``process_vm_readv``, in as many calls as it takes). False if the kernel refused (the
    errno in ``T_ERR``, q in ``T_BAD``): q has exited, or its memory is gone."""
    iov = carray(pointer(tab[L.T_BOUNCE] - 32, WORDS), 4)  # local, remote: base, length
    pid = tab[L.T_BASE + 2 * tab[L.T_P] + q]
    done = 0
    while done < nbytes:
        iov[0], iov[1] = dst + done, nbytes - done
        iov[2], iov[3] = src + done, nbytes - done
        got = _readv(tab[L.T_READV], pid, tab[L.T_BOUNCE] - 32, tab[L.T_BOUNCE] - 16)
        if got <= 0:
            tab[L.T_BAD], tab[L.T_ERR] = q, _errno(tab[L.T_ERRNO]) if got < 0 else 0
            return False
        done += got
    return True
