"""Numba kernels of the shared-memory collectives (private; the protocol is in ``team.py``).

They take only arrays and scalars. Memory of other processes is reached through raw addresses
(segments of MPI shared windows as mapped in this process), turned into typed arrays by
:func:`_pointer`; the Python side checks every address it hands over. Round counters are read
with acquire loads and written with release stores (:func:`load_acquire`, :func:`store_release`):
LLVM atomics, so the compiler neither caches a polled counter nor moves data accesses across it.

:func:`fold` reduces one segment from p operands in one pass over memory, in blocks of ``BLOCK``
elements that stay in L1 while every operand is combined into them, then stored to the other
destinations (a destination may be one of the operands, in place). Operands combine left to
right, i.e. in rank order, with NumPy's semantics: wrapping integers, min/max keeping the first
operand only when it is strictly smaller/larger or NaN (``np.minimum``'s choice: ``min(0.0,
-0.0)`` is ``-0.0``, NaN propagates), float16 computed in float32 and rounded to float16 after
every operation as NumPy does.

Element formats: a native dtype is its own format (the kernel arrays take its type); float16,
which Numba cannot type, travels as uint16 with the format token :data:`FLOAT16` (an empty array
of a one-field record dtype), and :func:`_widen` / :func:`_narrow` convert at load and store.
A further 16-bit format (bfloat16) needs one more token, and one more branch in each of the two.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic, overload

from . import layout as L

__all__ = ["NJIT", "FLOAT16", "engine", "fold", "load_acquire", "store_release"]

NJIT = dict(cache=True, nogil=True, fastmath=False)

BLOCK = L.FOLD_BLOCK

#: Format token of float16 data, stored as uint16 words.
FLOAT16 = np.empty(0, np.dtype([("float16", "<u2")]))

_SUM, _PROD, _MIN, _MAX = L.OPCODES["sum"], L.OPCODES["prod"], L.OPCODES["min"], L.OPCODES["max"]


def _is_float16(token) -> bool:
    dtype = getattr(token, "dtype", None)
    return isinstance(dtype, types.Record) and "float16" in dtype.fields


@intrinsic
def _pointer(typingctx, addr, token):
    """A typed pointer to ``addr`` for the element format of ``token``."""
    if not isinstance(addr, types.Integer) or not isinstance(token, types.Array):
        return None
    element = types.uint16 if _is_float16(token) else token.dtype
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
def _store_streaming(typingctx, addr, value):
    """Write the int64 ``value`` at ``addr`` with a non-temporal store (no read for ownership,
    bypassing the caches); weakly ordered, so :func:`_fence` before any release."""
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
def _fence(typingctx):
    """A full memory fence (orders non-temporal stores too)."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


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


@intrinsic
def _half_to_float(typingctx, bits):
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _float_to_half(typingctx, value):
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):  # round to nearest even, as NumPy
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(value), codegen


def _widen(value, token):  # pragma: no cover - replaced by the overload below
    """A stored element as the type the reduction computes in."""


def _narrow(value, token):  # pragma: no cover - replaced by the overload below
    """A computed value as the stored element."""


@overload(_widen, inline="always")
def _widen_impl(value, token):
    if _is_float16(token):
        return lambda value, token: _half_to_float(value)
    return lambda value, token: value


@overload(_narrow, inline="always")
def _narrow_impl(value, token):
    if _is_float16(token):
        return lambda value, token: _float_to_half(value)
    return lambda value, token: value


@njit(inline="always")
def _combine(op, a, b):  # pragma: no cover - compiled
    # ``op`` is the same for a whole loop, so LLVM unswitches it: one vector loop per op
    if op == _SUM:
        return a + b
    if op == _PROD:
        return a * b
    if op == _MIN:
        return a if (a < b or a != a) else b
    return a if (a > b or a != a) else b


@njit(**NJIT)
def fold(op, token, srcs, nsrc, dsts, ndst, count, scratch):  # pragma: no cover - compiled
    """``dsts[k][i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i]`` for every k < ndst.

    ``srcs``/``dsts`` hold addresses of ``count`` elements each. A destination may be one of the
    sources (in place): the first destination accumulates the result unless it is a source other
    than the first, in which case each block is combined in ``scratch`` (the address of ``BLOCK``
    elements, which stay in L1) and then stored.
    """
    if ndst == 0 or count == 0:
        return
    isz = token.itemsize
    in_place = False
    for q in range(1, nsrc):
        in_place = in_place or srcs[q] == dsts[0]
    for lo in range(0, count, BLOCK):
        c = min(BLOCK, count - lo)
        at = lo * isz
        acc = carray(_pointer(scratch if in_place else dsts[0] + at, token), c)
        a = carray(_pointer(srcs[0] + at, token), c)
        if nsrc == 1:
            acc = a
        else:
            b = carray(_pointer(srcs[1] + at, token), c)
            for i in range(c):
                acc[i] = _narrow(_combine(op, _widen(a[i], token), _widen(b[i], token)), token)
            for q in range(2, nsrc):
                s = carray(_pointer(srcs[q] + at, token), c)
                for i in range(c):
                    acc[i] = _narrow(_combine(op, _widen(acc[i], token), _widen(s[i], token)),
                                     token)
        for k in range(ndst):
            d = carray(_pointer(dsts[k] + at, token), c)
            if d.ctypes.data != acc.ctypes.data:
                for i in range(c):
                    d[i] = acc[i]


_BYTES = np.empty(0, np.uint8)   # format tokens of raw bytes and of control words
_WORDS = np.empty(0, np.int64)


@njit(**NJIT)
def _copy(dst, src, nbytes):  # pragma: no cover - compiled
    if nbytes > 0:
        d = carray(_pointer(dst, _BYTES), nbytes)
        s = carray(_pointer(src, _BYTES), nbytes)
        for i in range(nbytes):
            d[i] = s[i]


@njit(**NJIT)
def _copy_streaming(dst, src, nbytes):  # pragma: no cover - compiled
    """Like :func:`_copy`, with non-temporal stores for the 8-byte-aligned middle."""
    head = min(nbytes, (-dst) % 8)
    _copy(dst, src, head)
    words = (nbytes - head) // 8
    s = carray(_pointer(src + head, _WORDS), words)
    for i in range(words):
        _store_streaming(dst + head + i * 8, s[i])
    done = head + words * 8
    _copy(dst + done, src + done, nbytes - done)


@njit(**NJIT)
def _cma_read(tab, q, dst, src, nbytes):  # pragma: no cover - compiled
    """Copy ``nbytes`` at address ``src`` of rank q's process to ``dst`` of this one
    (``process_vm_readv``, in as many calls as it takes). False if the kernel refused (the
    errno in ``T_ERR``, q in ``T_BAD``): q has exited, or its memory is gone."""
    iov = carray(_pointer(tab[L.T_BOUNCE] - 32, _WORDS), 4)  # local, remote: base, length
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


@njit(**NJIT)
def _word(tab, q, word):  # pragma: no cover - compiled
    """Address of control word ``word`` of rank ``q``."""
    return tab[L.T_BASE + q] + word * 8


@njit(**NJIT)
def _all_reached(tab, word, target, hi, skip):  # pragma: no cover - compiled
    """Whether counter ``word`` of every rank below ``hi`` but ``skip`` is at least ``target``."""
    for q in range(hi):
        if q != skip and load_acquire(_word(tab, q, word)) < target:
            return False
    return True


@njit(**NJIT)
def _find(tab, regions, addr, nbytes):  # pragma: no cover - compiled
    """(region, offset) of my ``nbytes`` at ``addr`` inside a shared buffer, else (STAGED, 0)."""
    me = tab[L.T_ME]
    for r in range(regions.shape[0]):
        start = regions[r, 1 + me]
        if start <= addr and addr + nbytes <= start + regions[r, 0]:
            return r, addr - start
    return L.STAGED, 0


@njit(**NJIT)
def _segment_elements(slot_bytes, m, isz):  # pragma: no cover - compiled
    """Elements of one block's segment: m of them fill an input slot, cache-line aligned."""
    s = slot_bytes // (m * isz)
    line = 64 // isz
    if s >= line:
        s -= s % line
    return max(s, 1)


@njit(**NJIT)
def _span(n, m, b, t, seg):  # pragma: no cover - compiled
    """Element range [lo, hi) of segment ``t`` of block ``b`` (blocks: ``n`` split in ``m``)."""
    base, extra = n // m, n % m
    start = b * base + min(b, extra)
    stop = start + base + (1 if b < extra else 0)
    lo = min(start + t * seg, stop)
    return lo, min(lo + seg, stop)


@njit(**NJIT)
def _released(tab, me, p, last, word):  # pragma: no cover - compiled
    """Whether every other rank has entered a later call than this rank's round ``last`` (0:
    none), so that it reads nothing of it any more, or is done with it as counter ``word``
    says (DONE: it reads no input of it; FREED: no output slot). ``ENTER`` comes first: in a
    run of calls it settles the test, and its line was read at this call's entry."""
    call = last >> L.ROUND_BITS
    for q in range(p):
        if q != me and load_acquire(_word(tab, q, L.ENTER)) <= call and \
                load_acquire(_word(tab, q, word)) < last:
            return False
    return True


@njit(**NJIT)
def _entered_after(tab, me, p, last):  # pragma: no cover - compiled
    """Whether every other rank has entered a later call than this rank's round ``last`` (0:
    none): it reads nothing of that call any more (its descriptor included)."""
    if last == 0:
        return True
    call = last >> L.ROUND_BITS
    for q in range(p):
        if q != me and load_acquire(_word(tab, q, L.ENTER)) <= call:
            return False
    return True


@njit(**NJIT)
def _by_cma(tab, mode, nbytes):  # pragma: no cover - compiled
    """Whether this call moves private buffers by cross-memory attach (the same answer on every
    rank making the same call: the team agreed on ``T_CMA``, and mode and bytes are compared)."""
    return mode == L.FUSED and nbytes >= tab[L.T_CMA]


@njit(**NJIT)
def _start(tab, regions, xaddr, oaddr, nbytes, mode, m, rounds):  # pragma: no cover - compiled
    """Publish this rank's descriptor (in the copy no other rank reads any more), set the cursor,
    and move the counters of the steps this rank does not take in this call straight to the
    call's last round."""
    me = tab[L.T_ME]
    t0 = tab[L.T_CALL] << L.ROUND_BITS
    tl = t0 + rounds - 1
    xreg, xoff = _find(tab, regions, xaddr, nbytes)
    oreg, ooff = _find(tab, regions, oaddr, nbytes)
    if _by_cma(tab, mode, nbytes):  # the others read my private buffers themselves
        if xreg == L.STAGED:
            xreg, xoff = L.CMA, xaddr
        if oreg == L.STAGED:
            oreg, ooff = L.CMA, oaddr
    ctrl = tab[L.T_BASE + me]
    copy = tab[L.T_ORD] % 2
    words = carray(_pointer(ctrl + copy * L.DESCRIPTOR * 8, _WORDS), L.DESCRIPTOR)
    words[L.X_REGION] = xreg
    words[L.X_OFFSET] = xoff
    words[L.OUT_REGION] = oreg
    words[L.OUT_OFFSET] = ooff
    words[L.D_BYTES] = nbytes
    words[L.D_KIND] = tab[L.T_KIND]
    words[L.D_SLOT0] = tab[L.T_SLOT0] - rounds
    store_release(ctrl + (L.D_CALLS + copy) * 8, tab[L.T_CALL])
    tab[L.T_BASE + tab[L.T_P] + me] = copy
    tab[L.T_DLAST + copy] = tl
    tab[L.T_T0], tab[L.T_TL] = t0, tl
    if me < m or mode == L.REPLICATED:
        tab[L.T_TF] = t0
    else:  # not reducing: reads no input of this call
        tab[L.T_TF] = tl + 1
        store_release(ctrl + L.DONE * 8, tl)
    if mode == L.ALLGATHER or xreg != L.STAGED:  # nothing to stage: arrive for all rounds
        tab[L.T_TS] = tl + 1
        store_release(ctrl + L.READY * 8, tl)  # release: the descriptor is visible first
    else:
        tab[L.T_TS] = t0
    if mode == L.REDUCE_SCATTER or mode == L.REPLICATED or oreg >= 0:
        tab[L.T_TC] = tl + 1  # nothing to copy out
        store_release(ctrl + L.FREED * 8, tl)
    else:
        tab[L.T_TC] = t0
    tab[L.T_PHASE] = 2


@njit(**NJIT)
def _copy_of(tab, q):  # pragma: no cover - compiled
    """(index, call) of rank q's descriptor copy of this rank's current call (else of its newer
    copy, whose call then differs)."""
    at = tab[L.T_BASE + q] + L.D_CALLS * 8
    first, second = load_acquire(at), load_acquire(at + 8)
    if first == tab[L.T_CALL] or (second != tab[L.T_CALL] and first > second):
        return 0, first
    return 1, second


@njit(**NJIT)
def _descriptor(tab, q):  # pragma: no cover - compiled
    """Rank q's descriptor words of this rank's current call: the copy :func:`_agree` found
    (kept in the table: q rewrites the word it found it by in its next call)."""
    copy = tab[L.T_BASE + tab[L.T_P] + q]
    return carray(_pointer(tab[L.T_BASE + q] + copy * L.DESCRIPTOR * 8, _WORDS), L.DESCRIPTOR)


@njit(**NJIT)
def _agree(tab, q, nbytes):  # pragma: no cover - compiled
    """Whether rank q's call is this rank's, with the same bytes, dtype, op, mode and blocks
    (else records q in ``T_BAD``); notes q's descriptor copy for :func:`_descriptor`. Only
    after acquiring q's READY or DONE of this call, before reading anything else of q's."""
    copy, call = _copy_of(tab, q)
    tab[L.T_BASE + tab[L.T_P] + q] = copy
    words = _descriptor(tab, q)
    if call == tab[L.T_CALL] and words[L.D_BYTES] == nbytes and words[L.D_KIND] == tab[L.T_KIND]:
        return True
    tab[L.T_BAD] = q
    return False


@njit(**NJIT)
def _all_agree(tab, hi, me, nbytes):  # pragma: no cover - compiled
    """:func:`_agree` for every rank below ``hi`` but ``me``."""
    for q in range(hi):
        if q != me and not _agree(tab, q, nbytes):
            return False
    return True


@njit(**NJIT)
def _shared(tab, regions, q, word):  # pragma: no cover - compiled
    """Where rank q's input (``word`` X_REGION) or output (OUT_REGION) starts in this process,
    or 0 when it is staged. Reads q's descriptor: only after acquiring q's READY of this call."""
    words = _descriptor(tab, q)
    region = words[word]
    if region < 0:  # STAGED or CMA: not in a shared buffer
        return 0
    return regions[region, 1 + q] + words[word + 1]


@njit(**NJIT)
def _needs_slot(tab, me, p):  # pragma: no cover - compiled
    """Whether another rank copies its result out of the output slots (it has no shared out)."""
    for q in range(p):
        if q != me and _descriptor(tab, q)[L.OUT_REGION] == L.STAGED:
            return True
    return False


@njit(**NJIT)
def _slot(tab, q, i, output):  # pragma: no cover - compiled
    """Address of the input (``output`` 0) or output (1) slot of rank q that holds round ``i``
    of the current call (``(D_SLOT0 + i) mod SLOTS``, from q's descriptor)."""
    nslots = tab[L.T_SLOTS]
    k = (_descriptor(tab, q)[L.D_SLOT0] + i) % nslots
    return tab[L.T_BASE + q] + L.DATA_OFFSET + ((output * nslots) + k) * tab[L.T_SLOT_BYTES]


@njit(**NJIT)
def engine(tab, regions, x, out, token, op, mode, m, seq, kind):  # pragma: no cover - compiled
    """Run (or resume, ``tab[T_PHASE]`` > 0) a collective call of this rank of the given
    ``kind`` (``layout.D_KIND``), made in public call number ``seq`` (-1: outside one): it is
    numbered after the last one, and at least ``seq * CALLS_PER_SEQ``. Returns COMPLETE,
    WAITING, MISMATCH (another rank's call differs: ``tab[T_BAD]``) or TOO_LONG (more rounds
    than a call may have).

    ``m`` blocks (1 in REPLICATED mode), reduced by ranks ``0 .. m-1`` (by every rank in
    REPLICATED mode). Returns WAITING after ``tab[T_SPIN]`` polls without progress, with the
    cursor saved in ``tab``, so that the caller can yield the processor and call again.

    Counter invariants, for every rank q and round t (any mode): ``READY[q] >= t`` means q's
    input of round t can be read and q's descriptor of this call is published; ``DONE[q] >= t``
    means q reads no input of rounds <= t any more (and wrote its results of them); ``FREED[q]
    >= t`` means q reads no output slot (by cross-memory attach: no other rank's output) of
    rounds <= t any more. Returns CMA_FAILED when a read by cross-memory attach fails
    (``tab[T_BAD]``, ``tab[T_ERR]``).
    """
    me, p, nslots = tab[L.T_ME], tab[L.T_P], tab[L.T_SLOTS]
    n = out.size
    isz = token.itemsize
    nbytes = n * isz
    replicated = mode == L.REPLICATED
    hands_out = mode == L.FUSED or mode == L.ALLGATHER  # others need my block's result
    streaming = nbytes >= tab[L.T_STREAM]
    seg = _segment_elements(tab[L.T_SLOT_BYTES], m, isz)
    xaddr, oaddr = x.ctypes.data, out.ctypes.data
    mine = tab[L.T_BASE + me]
    cma = _by_cma(tab, mode, nbytes)
    idle = 0
    if tab[L.T_PHASE] == 0:  # enter: from now on, nothing of an earlier call is read by me
        longest = -(-n // m)  # elements of the longest block
        rounds = max(1, -(-longest // seg))
        if rounds >= 1 << L.ROUND_BITS:
            return L.TOO_LONG
        tab[L.T_TS] = rounds  # kept here until the call starts
        call = max(tab[L.T_CALL] + 1, seq * L.CALLS_PER_SEQ)
        tab[L.T_CALL], tab[L.T_KIND] = call, kind
        tab[L.T_ORD] += 1
        store_release(mine + L.ENTER * 8, call)
        tab[L.T_PHASE] = 1
    if tab[L.T_PHASE] == 1:  # wait until no rank reads the descriptor copy I am to rewrite
        last = tab[L.T_DLAST + tab[L.T_ORD] % 2]  # (every rank left its call, two calls ago)
        while not _entered_after(tab, me, p, last):
            idle += 1
            if idle > tab[L.T_SPIN]:
                return L.WAITING
        rounds = tab[L.T_TS]
        tab[L.T_SLOT0] += rounds  # this call's slots start at the old value (D_SLOT0)
        _start(tab, regions, xaddr, oaddr, nbytes, mode, m, rounds)
    t0, tl = tab[L.T_T0], tab[L.T_TL]
    s0 = _descriptor(tab, me)[L.D_SLOT0]
    ts, tf, tc = tab[L.T_TS], tab[L.T_TF], tab[L.T_TC]
    block = 0 if replicated else me  # the block this rank reduces
    scratch = mine + L.SCRATCH_OFFSET
    lists = carray(_pointer(scratch + BLOCK * 8, _WORDS), 2 * p + 1)
    srcs, dsts = lists[:p], lists[p:]
    while True:
        moved = False
        # 1. reduce my block's segment of round tf, once every rank has staged it (at the
        # first round, after checking that every rank makes the same call)
        if tf <= tl and ts > tf and _all_reached(tab, L.READY, tf, p, me):
            if tf == t0 and not _all_agree(tab, p, me, nbytes):
                return L.MISMATCH
            slot_wanted = hands_out and _needs_slot(tab, me, p)
            k = (s0 + tf - t0) % nslots  # my output slot of this round
            if not slot_wanted or _released(tab, me, p, tab[L.T_OUT + k], L.FREED):
                lo, hi = _span(n, m, block, tf - t0, seg)
                at = lo * isz
                nsrc = 1
                srcs[0] = xaddr + at
                if mode != L.ALLGATHER:
                    nsrc = 0
                    bounce = tab[L.T_BOUNCE]  # where remote private inputs land, one by one
                    for q in range(p):
                        if q == me:
                            srcs[nsrc] = xaddr + at
                        else:
                            base = _shared(tab, regions, q, L.X_REGION)
                            if base:
                                srcs[nsrc] = base + at
                            elif _descriptor(tab, q)[L.X_REGION] == L.CMA:
                                if not _cma_read(tab, q, bounce,
                                                 _descriptor(tab, q)[L.X_OFFSET] + at,
                                                 (hi - lo) * isz):
                                    return L.CMA_FAILED
                                srcs[nsrc] = bounce
                                bounce += seg * isz
                            else:
                                srcs[nsrc] = _slot(tab, q, tf - t0, 0) + block * seg * isz
                        nsrc += 1
                ndst = 0
                if oaddr != xaddr or mode != L.ALLGATHER:
                    dsts[0] = oaddr + at
                    ndst = 1
                if hands_out:
                    for q in range(p):
                        if q != me:
                            base = _shared(tab, regions, q, L.OUT_REGION)
                            if base != 0:
                                dsts[ndst] = base + at
                                ndst += 1
                    if slot_wanted:
                        dsts[ndst] = _slot(tab, me, tf - t0, 1)
                        ndst += 1
                        tab[L.T_OUT + k] = tf
                fold(op, token, srcs, nsrc, dsts, ndst, hi - lo, scratch)
                store_release(mine + L.DONE * 8, tf)
                tf += 1
                moved = True
        # 2. stage my input segments of round ts, once its slot is no longer read
        k = (s0 + ts - t0) % nslots  # my input slot of round ts
        if ts <= tl and (ts <= tf or tf > tl) and \
                _released(tab, me, p, tab[L.T_IN + k], L.DONE):
            into = _slot(tab, me, ts - t0, 0)
            for b in range(m):
                if b != me or replicated:
                    lo, hi = _span(n, m, b, ts - t0, seg)
                    _copy(into + b * seg * isz, xaddr + lo * isz, (hi - lo) * isz)
            store_release(mine + L.READY * 8, ts)
            tab[L.T_IN + k] = ts
            ts += 1
            moved = True
        # 3. copy every other block's segment of round tc out, once all are reduced (a long
        # result straight to memory: it would not stay in cache, and it saves a read per line)
        if tc <= tl and (tc < tf or tf > tl) and _all_reached(tab, L.DONE, tc, m, me):
            if tc == t0 and not _all_agree(tab, m, me, nbytes):
                return L.MISMATCH
            for b in range(m):
                if b != me:
                    lo, hi = _span(n, m, b, tc - t0, seg)
                    at = lo * isz
                    if not cma:  # the reducer's output slot
                        src = _slot(tab, b, tc - t0, 1)
                    elif _descriptor(tab, b)[L.OUT_REGION] == L.CMA:  # its private result
                        if not _cma_read(tab, b, oaddr + at,
                                         _descriptor(tab, b)[L.OUT_OFFSET] + at,
                                         (hi - lo) * isz):
                            return L.CMA_FAILED
                        continue
                    else:  # its result in a shared buffer
                        src = _shared(tab, regions, b, L.OUT_REGION) + at
                    if streaming:
                        _copy_streaming(oaddr + at, src, (hi - lo) * isz)
                    else:
                        _copy(oaddr + at, src, (hi - lo) * isz)
            store_release(mine + L.FREED * 8, tc)
            tc += 1
            moved = True
        if ts > tl and tf > tl and tc > tl:
            if streaming:
                _fence()
            # others may still read my input in place, or write my output: wait for them,
            # unless every rank reduces for itself from my staged copies (REPLICATED); by
            # cross-memory attach they also read my result from my output until their FREED
            if (replicated and _shared(tab, regions, me, L.X_REGION) == 0) or \
                    (_all_reached(tab, L.DONE, tl, p, me) and
                     (not cma or _all_reached(tab, L.FREED, tl, p, me))):
                tab[L.T_PHASE] = 0
                return L.COMPLETE
        if moved:
            idle = 0
        else:
            idle += 1
            if idle > tab[L.T_SPIN]:
                tab[L.T_TS], tab[L.T_TF], tab[L.T_TC] = ts, tf, tc
                return L.WAITING
