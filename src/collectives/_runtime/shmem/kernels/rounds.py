"""The round driver: one team call of this rank, round after round (private).

:func:`run_rounds` enters the call (numbers it, publishes its descriptor: ``protocol.open_call``),
then loops over the three steps of a round, each gated by the other ranks' counters
(``protocol``): reduce my block's segment (``arithmetic.fold``), stage my input segments, copy
the other blocks' segments out (``copies``). In the alltoall modes (``ALLTOALL``,
``ALLTOALL_CMA``) the first step copies my block's segment of every rank's input into my output
instead of reducing it, and there is nothing to copy out. docs/shm-protocol.md states the
protocol and proves it correct.

The steps stay in one function: as kernels of their own (operands, destinations, staging,
copying out) they are not inlined and add reference counting of the arrays they take to every
call (with ``inline="always"`` they are inlined, but the reference counting stays).

This is the one module ``team.py`` calls: :func:`run_rounds`, and :data:`FLOAT16` (from
``memory``), the format token it passes as ``token`` for float16 data (as uint16 words).
"""

from __future__ import annotations

from compress import compile_notice
from numba import carray, njit

from .. import layout as L
from . import NJIT
from .arithmetic import BLOCK, fold
from .copies import cma_read, copy, copy_streaming
from .memory import FLOAT16, WORDS, fence, pointer, store_release
from .protocol import (all_agree, all_reached, by_cma, counts_agree, descriptor, entered_after,
                       needs_slot, offsets, open_call, released, segment_elements, shared, slot,
                       span)

__all__ = ["run_rounds", "FLOAT16"]

compile_notice.install()  # a line on rank 0 while a first compile stalls a call


@njit(**NJIT)
def run_rounds(tab, regions, x, out, token, op, mode, m, seq, kind):  # pragma: no cover - compiled
    """Run (or resume, ``tab[T_PHASE]`` > 0) a collective call of this rank of the given
    ``kind`` (``layout.D_KIND``), made in public call number ``seq`` (-1: outside one): it is
    numbered after the last one, and at least ``seq * CALLS_PER_SEQ``. Returns COMPLETE,
    WAITING, MISMATCH (another rank's call differs: ``tab[T_BAD]``) or TOO_LONG (more rounds
    than a call may have).

    ``m`` blocks (1 in REPLICATED mode), reduced by ranks ``0 .. m-1`` (by every rank in
    REPLICATED mode; in the ALLTOALL modes, ``m = p`` and rank b copies block b of every input
    into block q of its output, q the input's rank: equal blocks, or in ALLTOALLV mode those of
    the send and receive offsets in ``tab``, which the caller checked against ``x`` and ``out``,
    and whose counts every rank compares pairwise before any reads another's data: COUNTS
    where they disagree). Returns WAITING after ``tab[T_SPIN]``
    polls without progress, with the cursor saved in ``tab``, so that the caller can yield the
    processor and call again.

    Counter invariants, for every rank q and round t (any mode): ``READY[q] >= t`` means q's
    input of round t can be read and q's descriptor of this call is published; ``DONE[q] >= t``
    means q reads no input of rounds <= t any more (and wrote its results of them); ``FREED[q]
    >= t`` means q reads no output slot (by cross-memory attach: no other rank's output) of
    rounds <= t any more. An alltoall's ranks may have different numbers of rounds (each as many
    as its own blocks through the slots need): a rank done with its last one raises its
    counters to the call's last possible round (``LAST_ROUND``), so that no rank waits on it
    for a round it does not have. Returns CMA_FAILED when a read by cross-memory attach fails
    (``tab[T_BAD]``, ``tab[T_ERR]``).
    """
    me, p, nslots = tab[L.T_ME], tab[L.T_P], tab[L.T_SLOTS]
    n = out.size
    isz = token.itemsize
    nbytes = n * isz
    replicated = mode == L.REPLICATED
    hands_out = mode == L.FUSED or mode == L.ALLGATHER  # others need my block's result
    streaming = nbytes >= tab[L.T_STREAM]
    cma = by_cma(tab, mode, nbytes)
    # a round fills a slot; by cross-memory attach, which stages nothing, the bounce buffer
    # (larger where the slots are small: fewer system calls)
    seg = segment_elements(tab[L.T_CMA_SEGMENT] if cma else tab[L.T_SLOT_BYTES], m, isz)
    exchange = mode >= L.ALLTOALL  # alltoall: copies of my block of every input, no reduction
    xaddr, oaddr = x.ctypes.data, out.ctypes.data
    mine = tab[L.T_BASE + me]
    idle = 0
    # an alltoall's blocks: the offsets (elements) of block b in my input, sends[b] to
    # sends[b + 1], and in my output, got[b] to got[b + 1] (the caller's, checked by it, in the
    # v form; else equal blocks, set here); blocks from ``far`` bytes on are read whole by
    # cross-memory attach in the first round, the others through the slots, ``seg`` a round
    sends = tab[L.T_BASE + 3 * p:L.T_BASE + 4 * p + 1]
    got = tab[L.T_BASE + 4 * p + 1:L.T_BASE + 5 * p + 2]
    far = 1 << 62
    longest = -(-n // m)  # elements of the longest block through the slots
    lend = False  # a block of my input is read by cross-memory attach
    if exchange:
        seg = segment_elements(tab[L.T_SLOT_BYTES], m, isz)
        if mode == L.ALLTOALL_CMA:
            far = 0
        elif mode == L.ALLTOALLV:
            far = tab[L.T_A2A_CMA]
        else:
            far = 1 << 62
        if mode != L.ALLTOALLV and tab[L.T_PHASE] == 0:
            for b in range(p + 1):
                sends[b] = b * (n // p)
                got[b] = b * (n // p)
        longest = 0
        for b in range(p):
            if b != me:
                count = sends[b + 1] - sends[b]
                if count * isz < far:
                    longest = max(longest, count)
                else:
                    lend = True
                count = got[b + 1] - got[b]
                if count * isz < far:
                    longest = max(longest, count)
    if tab[L.T_PHASE] == 0:  # enter: from now on, nothing of an earlier call is read by me
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
        while not entered_after(tab, me, p, last):
            idle += 1
            if idle > tab[L.T_SPIN]:
                return L.WAITING
        rounds = tab[L.T_TS]
        tab[L.T_SLOT0] += rounds  # this call's slots start at the old value (D_SLOT0)
        open_call(tab, regions, xaddr, oaddr, x.size * isz if exchange else nbytes, nbytes,
                  mode, m, rounds, lend and mode == L.ALLTOALLV)
    t0, tl = tab[L.T_T0], tab[L.T_TL]
    s0 = descriptor(tab, me)[L.D_SLOT0]
    ts, tf, tc = tab[L.T_TS], tab[L.T_TF], tab[L.T_TC]
    block = 0 if replicated else me  # the block this rank reduces
    scratch = mine + L.SCRATCH_OFFSET
    lists = carray(pointer(scratch + BLOCK * 8, WORDS), 2 * p + 1)
    srcs, dsts = lists[:p], lists[p:]
    while True:
        moved = False
        # 1. reduce my block's segment of round tf, once every rank has staged it (at the
        # first round, after checking that every rank makes the same call)
        if tf <= tl and ts > tf and all_reached(tab, L.READY, tf, p, me):
            if tf == t0 and not all_agree(tab, p, me, -1 if mode == L.ALLTOALLV else nbytes):
                return L.MISMATCH
            slot_wanted = hands_out and needs_slot(tab, me, p)
            k = (s0 + tf - t0) % nslots  # my output slot of this round
            if exchange:  # segment tf of my block of rank q's input to block q of my output
                if tf == t0 and mode == L.ALLTOALLV and not counts_agree(tab, p):
                    return L.COUNTS
                i = tf - t0
                for q in range(p):
                    count = got[q + 1] - got[q]  # (= what q sends me: compared above)
                    into = oaddr + got[q] * isz
                    if q == me:  # my own block, whole, at the first round
                        if i == 0:
                            copy(into, xaddr + sends[me] * isz, count * isz)
                        continue
                    base = shared(tab, regions, q, L.X_REGION)
                    if base or count * isz >= far:  # read in place, whole, at the first round
                        if i == 0:
                            at = carray(pointer(offsets(tab, q), WORDS), p + 1)[me] * isz
                            if base:
                                copy(into, base + at, count * isz)
                            elif not cma_read(tab, q, into, descriptor(tab, q)[L.X_OFFSET] + at,
                                              count * isz):
                                return L.CMA_FAILED
                        continue
                    lo = min(i * seg, count)  # through q's slot: segment i
                    hi = min(lo + seg, count)
                    copy(into + lo * isz, slot(tab, q, i, 0) + me * seg * isz, (hi - lo) * isz)
                store_release(mine + L.DONE * 8, tf if tf < tl else t0 + L.LAST_ROUND)
                tf += 1
                moved = True
            elif not slot_wanted or released(tab, me, p, tab[L.T_OUT + k], L.FREED):
                lo, hi = span(n, m, block, tf - t0, seg)
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
                            base = shared(tab, regions, q, L.X_REGION)
                            if base:
                                srcs[nsrc] = base + at
                            elif descriptor(tab, q)[L.X_REGION] == L.CMA:
                                if not cma_read(tab, q, bounce,
                                                descriptor(tab, q)[L.X_OFFSET] + at,
                                                (hi - lo) * isz):
                                    return L.CMA_FAILED
                                srcs[nsrc] = bounce
                                bounce += seg * isz
                            else:
                                srcs[nsrc] = slot(tab, q, tf - t0, 0) + block * seg * isz
                        nsrc += 1
                ndst = 0
                if oaddr != xaddr or mode != L.ALLGATHER:
                    dsts[0] = oaddr + at
                    ndst = 1
                if hands_out:
                    for q in range(p):
                        if q != me:
                            base = shared(tab, regions, q, L.OUT_REGION)
                            if base != 0:
                                dsts[ndst] = base + at
                                ndst += 1
                    if slot_wanted:
                        dsts[ndst] = slot(tab, me, tf - t0, 1)
                        ndst += 1
                        tab[L.T_OUT + k] = tf
                fold(op, token, srcs, nsrc, dsts, ndst, hi - lo, scratch)
                store_release(mine + L.DONE * 8, tf)
                tf += 1
                moved = True
        # 2. stage my input segments of round ts, once its slot is no longer read
        k = (s0 + ts - t0) % nslots  # my input slot of round ts
        if ts <= tl and (ts <= tf or tf > tl) and \
                released(tab, me, p, tab[L.T_IN + k], L.DONE):
            into = slot(tab, me, ts - t0, 0)
            for b in range(m):
                if exchange:  # segment ts of each block the slots carry
                    count = sends[b + 1] - sends[b]
                    if b != me and count * isz < far:
                        lo = min((ts - t0) * seg, count)
                        hi = min(lo + seg, count)
                        copy(into + b * seg * isz, xaddr + (sends[b] + lo) * isz,
                             (hi - lo) * isz)
                elif b != me or replicated:
                    lo, hi = span(n, m, b, ts - t0, seg)
                    copy(into + b * seg * isz, xaddr + lo * isz, (hi - lo) * isz)
            store_release(mine + L.READY * 8,
                          t0 + L.LAST_ROUND if exchange and ts == tl else ts)
            tab[L.T_IN + k] = ts
            ts += 1
            moved = True
        # 3. copy every other block's segment of round tc out, once all are reduced (a long
        # result straight to memory: it would not stay in cache, and it saves a read per line)
        if tc <= tl and (tc < tf or tf > tl) and all_reached(tab, L.DONE, tc, m, me):
            if tc == t0 and not all_agree(tab, m, me, nbytes):
                return L.MISMATCH
            for b in range(m):
                if b != me:
                    lo, hi = span(n, m, b, tc - t0, seg)
                    at = lo * isz
                    if not cma:  # the reducer's output slot
                        src = slot(tab, b, tc - t0, 1)
                    elif descriptor(tab, b)[L.OUT_REGION] == L.CMA:  # its private result
                        if not cma_read(tab, b, oaddr + at,
                                        descriptor(tab, b)[L.OUT_OFFSET] + at,
                                        (hi - lo) * isz):
                            return L.CMA_FAILED
                        continue
                    else:  # its result in a shared buffer
                        src = shared(tab, regions, b, L.OUT_REGION) + at
                    if streaming:
                        copy_streaming(oaddr + at, src, (hi - lo) * isz)
                    else:
                        copy(oaddr + at, src, (hi - lo) * isz)
            store_release(mine + L.FREED * 8, tc)
            tc += 1
            moved = True
        if ts > tl and tf > tl and tc > tl:
            if streaming:
                fence()
            # others may still read my input in place, or write my output: wait for them,
            # unless every rank reads only my staged copies (REPLICATED, a staged ALLTOALL);
            # by cross-memory attach they also read my result from my output until their FREED
            # (an alltoall's ranks may have fewer or more rounds: they end at the last one)
            staged_only = (replicated and shared(tab, regions, me, L.X_REGION) == 0) or \
                (exchange and descriptor(tab, me)[L.X_REGION] == L.STAGED)
            last = t0 + L.LAST_ROUND if exchange else tl
            if staged_only or \
                    (all_reached(tab, L.DONE, last, p, me) and
                     (not cma or all_reached(tab, L.FREED, last, p, me))):
                tab[L.T_PHASE] = 0
                return L.COMPLETE
        if moved:
            idle = 0
        else:
            idle += 1
            if idle > tab[L.T_SPIN]:
                tab[L.T_TS], tab[L.T_TF], tab[L.T_TC] = ts, tf, tc
                return L.WAITING
