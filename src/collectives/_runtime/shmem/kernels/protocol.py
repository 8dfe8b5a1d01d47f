"""The protocol's counters, slots and descriptors, as the round driver reads them (private).

Every rank's control block (``layout.py``) holds its round counters ``READY``, ``DONE`` and
``FREED``, the number of the last call it entered (``ENTER``) and two descriptor copies of its
calls. Here are the questions the driver (``rounds.py``) asks of them, and the one write that
opens a call (:func:`open_call`):

- *who has reached a round*: :func:`all_reached`;
- *whether a slot or descriptor copy may be rewritten* (nobody reads it any more):
  :func:`released`, :func:`entered_after`;
- *whether every rank makes the same call*: :func:`all_agree`, which also notes the descriptor
  copy of each rank's call for :func:`descriptor`, and for an alltoall of the offset tables'
  blocks :func:`counts_agree` (what each rank sends each other is what that one expects);
- *where a round's data lies*: :func:`span` (elements of a block's segment),
  :func:`shared` (another rank's input or output in a shared buffer), :func:`slot` (a rank's
  input or output slot of a round), :func:`needs_slot`, :func:`by_cma`, :func:`offsets` (a
  rank's offset table of the current call).

The rules they implement, and why they make the protocol correct, are in docs/shm-protocol.md.
"""

from __future__ import annotations

from numba import carray, njit

from .. import layout as L
from . import NJIT
from .memory import WORDS, load_acquire, pointer, store_release

__all__ = ["all_reached", "segment_elements", "span", "released", "entered_after", "by_cma",
           "open_call", "descriptor", "all_agree", "counts_agree", "offsets", "shared",
           "needs_slot", "slot"]


@njit(**NJIT)
def _word(tab, q, word):  # pragma: no cover - compiled
    """Address of control word ``word`` of rank ``q``."""
    return tab[L.T_BASE + q] + word * 8


@njit(**NJIT)
def all_reached(tab, word, target, hi, skip):  # pragma: no cover - compiled
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
def segment_elements(slot_bytes, m, isz):  # pragma: no cover - compiled
    """Elements of one block's segment: m of them fill an input slot, cache-line aligned."""
    s = slot_bytes // (m * isz)
    line = 64 // isz
    if s >= line:
        s -= s % line
    return max(s, 1)


@njit(**NJIT)
def span(n, m, b, t, seg):  # pragma: no cover - compiled
    """Element range [lo, hi) of segment ``t`` of block ``b`` (blocks: ``n`` split in ``m``)."""
    base, extra = n // m, n % m
    start = b * base + min(b, extra)
    stop = start + base + (1 if b < extra else 0)
    lo = min(start + t * seg, stop)
    return lo, min(lo + seg, stop)


@njit(**NJIT)
def released(tab, me, p, last, word):  # pragma: no cover - compiled
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
def entered_after(tab, me, p, last):  # pragma: no cover - compiled
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
def by_cma(tab, mode, nbytes):  # pragma: no cover - compiled
    """Whether this call moves private buffers by cross-memory attach (the same answer on every
    rank making the same call: the team agreed on ``T_CMA``, and mode and bytes are compared;
    an alltoall's caller chooses the mode)."""
    return (mode == L.FUSED and nbytes >= tab[L.T_CMA]) or mode == L.ALLTOALL_CMA


@njit(**NJIT)
def open_call(tab, regions, xaddr, oaddr, xbytes, nbytes, mode, m, rounds,
              lend):  # pragma: no cover - compiled
    """Publish this rank's descriptor (in the copy no other rank reads any more), and in the
    alltoall modes its offset table (``tab``'s send and receive offsets), set the cursor, and
    move the counters of the steps this rank does not take in this call straight to the call's
    last round. ``xbytes``: the input's bytes (an alltoall's may differ from the output's);
    ``lend``: the others read blocks of my private input by cross-memory attach (an
    ``ALLTOALLV`` with a block past ``T_A2A_CMA``)."""
    me, p = tab[L.T_ME], tab[L.T_P]
    t0 = tab[L.T_CALL] << L.ROUND_BITS
    tl = t0 + rounds - 1
    exchange = mode >= L.ALLTOALL
    xreg, xoff = _find(tab, regions, xaddr, xbytes)
    oreg, ooff = _find(tab, regions, oaddr, nbytes)
    if by_cma(tab, mode, nbytes) or lend:  # the others read my private buffers themselves
        if xreg == L.STAGED:
            xreg, xoff = L.CMA, xaddr
        if oreg == L.STAGED:
            oreg, ooff = L.CMA, oaddr
    ctrl = tab[L.T_BASE + me]
    copy = tab[L.T_ORD] % 2
    words = carray(pointer(ctrl + copy * L.DESCRIPTOR * 8, WORDS), L.DESCRIPTOR)
    words[L.X_REGION] = xreg
    words[L.X_OFFSET] = xoff
    words[L.OUT_REGION] = oreg
    words[L.OUT_OFFSET] = ooff
    words[L.D_BYTES] = nbytes
    words[L.D_KIND] = tab[L.T_KIND]
    words[L.D_SLOT0] = tab[L.T_SLOT0] - rounds
    words[L.D_FAR] = tab[L.T_A2A_CMA] if mode == L.ALLTOALLV else 0
    tab[L.T_BASE + p + me] = copy
    if exchange:  # published before READY (below, or at the first staging) releases it
        table = carray(pointer(offsets(tab, me), WORDS), 2 * (p + 1))
        sent = L.T_BASE + 3 * p
        for i in range(2 * (p + 1)):
            table[i] = tab[sent + i]
    store_release(ctrl + (L.D_CALLS + copy) * 8, tab[L.T_CALL])
    tab[L.T_DLAST + copy] = tl
    tab[L.T_T0], tab[L.T_TL] = t0, tl
    # an alltoall's ranks may have different numbers of rounds: a rank done with all of its
    # own stands at the call's last possible round, waited for by none
    end = t0 + L.LAST_ROUND if exchange else tl
    if me < m or mode == L.REPLICATED:
        tab[L.T_TF] = t0
    else:  # not reducing: reads no input of this call
        tab[L.T_TF] = tl + 1
        store_release(ctrl + L.DONE * 8, tl)
    if mode == L.ALLGATHER or (xreg != L.STAGED and not (mode == L.ALLTOALLV and
                                                          xreg == L.CMA)):
        tab[L.T_TS] = tl + 1  # nothing to stage: arrive for all rounds
        store_release(ctrl + L.READY * 8, end)  # release: the descriptor is visible first
    else:
        tab[L.T_TS] = t0
    if mode == L.REDUCE_SCATTER or mode == L.REPLICATED or exchange or oreg >= 0:
        tab[L.T_TC] = tl + 1  # nothing to copy out (an alltoall writes only its own output)
        store_release(ctrl + L.FREED * 8, end)
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
def descriptor(tab, q):  # pragma: no cover - compiled
    """Rank q's descriptor words of this rank's current call: the copy :func:`_agree` found
    (kept in the table: q rewrites the word it found it by in its next call)."""
    copy = tab[L.T_BASE + tab[L.T_P] + q]
    return carray(pointer(tab[L.T_BASE + q] + copy * L.DESCRIPTOR * 8, WORDS), L.DESCRIPTOR)


@njit(**NJIT)
def _agree(tab, q, nbytes):  # pragma: no cover - compiled
    """Whether rank q's call is this rank's, with the same bytes (unless ``nbytes`` is -1:
    then the same ``T_A2A_CMA``), dtype, op, mode and blocks (else records q in ``T_BAD``);
    notes q's descriptor copy for :func:`descriptor`. Only after acquiring q's READY or DONE
    of this call, before reading anything else of q's."""
    copy, call = _copy_of(tab, q)
    tab[L.T_BASE + tab[L.T_P] + q] = copy
    words = descriptor(tab, q)
    # (nbytes -1: an ALLTOALLV, whose bytes differ by rank, counts_agree comparing its blocks;
    # its threshold decides how each block travels, so both ends of every block must agree)
    if call == tab[L.T_CALL] and words[L.D_KIND] == tab[L.T_KIND]:
        if nbytes >= 0:
            if words[L.D_BYTES] == nbytes:
                return True
        elif words[L.D_FAR] == tab[L.T_A2A_CMA]:
            return True
    tab[L.T_BAD] = q
    return False


@njit(**NJIT)
def all_agree(tab, hi, me, nbytes):  # pragma: no cover - compiled
    """:func:`_agree` for every rank below ``hi`` but ``me``."""
    for q in range(hi):
        if q != me and not _agree(tab, q, nbytes):
            return False
    return True


@njit(**NJIT)
def offsets(tab, q):  # pragma: no cover - compiled
    """Address of rank q's offset table of this rank's current call (send offsets, then receive
    offsets, ``p + 1`` words each), in the copy of q's descriptor (after :func:`all_agree`, or
    this rank's own after :func:`open_call`)."""
    copy = tab[L.T_BASE + tab[L.T_P] + q]
    return tab[L.T_BASE + q] + L.DATA_OFFSET + 2 * tab[L.T_SLOTS] * tab[L.T_SLOT_BYTES] + \
        copy * 2 * (tab[L.T_P] + 1) * 8


@njit(**NJIT)
def counts_agree(tab, p):  # pragma: no cover - compiled
    """Whether, for every pair of ranks, the bytes rank a sends rank b (a's send offsets) are
    the bytes b expects from a (b's receive offsets); else records the first pair found (``T_BAD``
    sends ``T_SENT`` bytes to ``T_TO``, which expects ``T_WANT``). Every rank scans every pair in
    the same order, so every rank finds the same one. After :func:`all_agree`."""
    for b in range(p):
        received = carray(pointer(offsets(tab, b), WORDS), 2 * (p + 1))[p + 1:]
        for a in range(p):
            sends = carray(pointer(offsets(tab, a), WORDS), p + 1)
            sent, want = sends[b + 1] - sends[b], received[a + 1] - received[a]
            if sent != want:
                tab[L.T_BAD], tab[L.T_TO], tab[L.T_SENT], tab[L.T_WANT] = a, b, sent, want
                return False
    return True


@njit(**NJIT)
def shared(tab, regions, q, word):  # pragma: no cover - compiled
    """Where rank q's input (``word`` X_REGION) or output (OUT_REGION) starts in this process,
    or 0 when it is staged. Reads q's descriptor: only after acquiring q's READY of this call."""
    words = descriptor(tab, q)
    region = words[word]
    if region < 0:  # STAGED or CMA: not in a shared buffer
        return 0
    return regions[region, 1 + q] + words[word + 1]


@njit(**NJIT)
def needs_slot(tab, me, p):  # pragma: no cover - compiled
    """Whether another rank copies its result out of the output slots (it has no shared out)."""
    for q in range(p):
        if q != me and descriptor(tab, q)[L.OUT_REGION] == L.STAGED:
            return True
    return False


@njit(**NJIT)
def slot(tab, q, i, output):  # pragma: no cover - compiled
    """Address of the input (``output`` 0) or output (1) slot of rank q that holds round ``i``
    of the current call (``(D_SLOT0 + i) mod SLOTS``, from q's descriptor)."""
    nslots = tab[L.T_SLOTS]
    k = (descriptor(tab, q)[L.D_SLOT0] + i) % nslots
    return tab[L.T_BASE + q] + L.DATA_OFFSET + ((output * nslots) + k) * tab[L.T_SLOT_BYTES]
