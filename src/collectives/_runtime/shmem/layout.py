"""The shared-memory protocol's numbers, shared by the Python side and the Numba kernels.

Nothing here imports Numba. docs/shm-protocol.md explains the protocol; this module only names
the words.

A team's window gives every rank one segment (``Allocate_shared``), laid out as

- ``[0, CTRL_BYTES)``: the rank's control block of int64 words. The *descriptor*, words
  ``X_REGION`` ... ``D_SLOT0`` (two copies) and ``D_CALLS``, says where this call's input and
  output live and what the call is (its number, its byte count, and its dtype, op, mode and
  block count packed in one word, which every other rank compares with its own). ``READY``,
  ``DONE`` and ``FREED`` are its three round counters and ``ENTER`` the number of the last call
  it entered, each on its own 64-byte cache line (``ENTER`` with the descriptors' call numbers,
  written together at a call's entry), so that a rank polling one word does not slow the
  writer of another.
- ``[SCRATCH_OFFSET, DATA_OFFSET)``: scratch that only this rank touches (the L1 block in which
  the fold kernel combines, and the operand address lists).
- ``[DATA_OFFSET, DATA_OFFSET + SLOTS * slot_bytes)``: the rank's input slots, where it stages
  segments of its input for the ranks that reduce them;
- then ``SLOTS`` output slots, where it puts the segments it reduced for the ranks that copy them;
- then two copies of the rank's *offset table* (:func:`offsets_at`: an alltoall's send
  offsets, then its receive offsets, ``p + 1`` words each, in bytes), copy ``j`` belonging to
  the call of descriptor copy ``j`` and rewritten under the same rule: the other ranks read
  where their blocks lie in this rank's input, and compare the counts, from it.

Each process also keeps a private int64 array, the *table* (``T_*`` indices), holding its rank,
the team size, the slot geometry, the call's number and kind, the last round that used each of
its slots and descriptor copies, every rank's segment address as mapped in this process and
process id, what cross-memory attach needs (threshold, C functions, bounce buffer), plus the
cursor that lets a call that had to wait resume where it stopped.

Rounds are numbered ``(call << ROUND_BITS) + i`` for the ``i``-th round of a call: every counter
a call leaves behind, finished or failed, is smaller than every round of any later call.
"""

from __future__ import annotations

__all__ = [
    "SLOTS", "CTRL_BYTES", "FOLD_BLOCK", "MAX_TEAM", "SCRATCH_OFFSET", "SCRATCH_BYTES",
    "DATA_OFFSET", "X_REGION", "X_OFFSET", "OUT_REGION", "OUT_OFFSET", "D_BYTES",
    "D_KIND", "kind", "D_SLOT0", "D_FAR", "DESCRIPTOR", "D_CALLS", "READY", "DONE", "FREED", "ENTER",
    "ROUND_BITS", "LAST_ROUND",
    "CALLS_PER_SEQ", "STAGED", "FUSED", "REDUCE_SCATTER", "ALLGATHER", "REPLICATED", "ALLTOALL",
    "ALLTOALL_CMA", "ALLTOALLV", "OPCODES",
    "COMPLETE", "WAITING", "MISMATCH", "TOO_LONG", "CMA_FAILED", "COUNTS", "STREAM_BYTES", "CMA",
    "T_ME", "T_P", "T_SLOTS",
    "T_SLOT_BYTES", "T_SPIN", "T_PHASE", "T_TS", "T_TF", "T_TC", "T_T0", "T_TL", "T_CALL",
    "T_STREAM", "T_KIND", "T_ORD", "T_BAD", "T_SLOT0", "T_DLAST", "T_IN", "T_OUT", "T_CMA",
    "T_READV", "T_ERRNO", "T_BOUNCE", "T_ERR", "T_CMA_SEGMENT", "T_A2A_CMA", "T_TO", "T_SENT",
    "T_WANT", "T_BASE", "send_index", "recv_index", "table_words", "window_bytes", "offsets_at",
    "segment_bytes",
]

#: Slots per rank and direction: a rank may stage round t while round t - SLOTS is the oldest
#: one any rank may still be reading.
SLOTS = 2
CTRL_BYTES = 384
#: Elements the fold kernel combines at a time (16 KiB of float64: stays in L1).
FOLD_BLOCK = 2048
#: Most ranks a team may have (the operand address lists live in the scratch area).
MAX_TEAM = 1024
SCRATCH_OFFSET = 4096
SCRATCH_BYTES = -(-(FOLD_BLOCK * 8 + (2 * MAX_TEAM + 1) * 8) // 4096) * 4096
DATA_OFFSET = SCRATCH_OFFSET + SCRATCH_BYTES  # slots start on their own page

# control words (int64 index into a rank's control block). Two copies of the descriptor, words
# [j * DESCRIPTOR, (j + 1) * DESCRIPTOR): a rank's calls use them in turn, so that it may
# publish its next call's while a slower rank still reads this one's; copy j belongs to call
# D_CALLS + j, and a reader takes the copy of its own call.
X_REGION, X_OFFSET, OUT_REGION, OUT_OFFSET = 0, 1, 2, 3
# the call's bytes, its kind (dtype.num | opcode << 8 | mode << 16 | m << 24), and the slot of
# its first round (round i uses slot (D_SLOT0 + i) mod SLOTS, in and out)
D_BYTES, D_KIND, D_SLOT0 = 4, 5, 6
# an ALLTOALLV's T_A2A_CMA (which blocks go by cross-memory attach: both ends must agree), else 0
D_FAR = 7
DESCRIPTOR = 8
READY = 16   # last round whose input segments this rank has staged (or: all, at arrival)
DONE = 24    # last round this rank has reduced (it has stopped reading inputs of that round)
FREED = 32   # last round this rank has copied out (it has stopped reading output slots of it)
ENTER = 40   # last call this rank entered (it reads nothing of any earlier call any more)
D_CALLS = 41  # D_CALLS + j: the call whose descriptor copy j holds

#: A call has fewer than ``2**ROUND_BITS`` rounds; its round i is ``(call << ROUND_BITS) + i``.
ROUND_BITS = 20
#: The last round a call may have, relative to its first: a rank done with every round of an
#: alltoall, whose ranks may have different numbers of rounds, raises ``READY`` and ``DONE`` to
#: ``t0 + LAST_ROUND`` (no round of this call is waited for on it any more).
LAST_ROUND = (1 << ROUND_BITS) - 1
#: Team calls one public call may make (``hierarchical`` makes two): a public call numbered
#: ``seq`` by its guard numbers its team calls from ``seq * CALLS_PER_SEQ`` on every rank, so the
#: ranks agree on call numbers after a failure whatever each of them did in the failed call.
CALLS_PER_SEQ = 64

# what one run_rounds call returns
COMPLETE, WAITING, MISMATCH, TOO_LONG, CMA_FAILED = 1, 0, -1, -2, -3
#: ... or: an alltoall's counts disagree (``T_BAD`` sends ``T_SENT`` bytes to ``T_TO``, which
#: expects ``T_WANT``), found by every rank before any reads another's data
COUNTS = -4

#: From this many bytes (default of the table's ``T_STREAM``), results are copied out with
#: non-temporal stores.
STREAM_BYTES = 8 << 20

#: Region index meaning "not in a shared buffer: staged through the slots".
STAGED = -1
#: Region index meaning "not in a shared buffer: the other ranks read it from this rank's
#: memory with ``process_vm_readv`` (cross-memory attach); the offset word holds its address".
CMA = -2

# modes of one run_rounds call
FUSED = 0           # allreduce: reduce my block from every input, every rank copies every block
REDUCE_SCATTER = 1  # the first m ranks reduce their block into their own output only
ALLGATHER = 2       # the first m ranks hand out their block of their own input
REPLICATED = 3      # allreduce of a short vector: every rank reduces all of it from every input
ALLTOALL = 4        # alltoall: every rank copies its block of every input (staged or shared)
ALLTOALL_CMA = 5    # alltoall reading private inputs by cross-memory attach, in one round
ALLTOALLV = 6       # alltoall of the blocks the offset tables give (the v form): each block
#                     from T_A2A_CMA bytes on by cross-memory attach, in one round, the others
#                     through the slots, every rank in as many rounds as its own blocks need
# (an alltoall's "op" word is the element dtype's number: its data travels as bytes)

#: Reduction codes of the kernels, by ``collectives.ops`` name ("avg" sums; the caller divides).
OPCODES = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 0}

# the private table
T_ME, T_P, T_SLOTS, T_SLOT_BYTES, T_SPIN, T_PHASE = 0, 1, 2, 3, 4, 5
T_TS, T_TF, T_TC, T_T0, T_TL = 6, 7, 8, 9, 10
T_CALL, T_STREAM, T_KIND = 11, 12, 13  # this call's number, streaming threshold, kind
T_ORD = 14   # calls this rank has entered (its descriptor copy: T_ORD mod 2)
T_BAD = 15   # after MISMATCH: the rank whose descriptor differs
T_SLOT0 = 16  # rounds this rank has numbered slots for (this call's D_SLOT0)
T_DLAST = 17  # T_DLAST + j: last round of the call that last used descriptor copy j (0: none)
T_IN = 19    # T_IN + k: last round staged into input slot k
T_OUT = T_IN + SLOTS  # T_OUT + k: last round written into output slot k
T_CMA = 23   # bytes from which an allreduce uses cross-memory attach (a huge value: never)
T_READV, T_ERRNO = 24, 25  # addresses of the C library's process_vm_readv, __errno_location
T_BOUNCE = 26  # address of this rank's private bounce buffer (one slot's bytes)
T_ERR = 27   # after CMA_FAILED: the errno (the rank is in T_BAD)
T_CMA_SEGMENT = 28  # bytes of one round of a call by cross-memory attach (the bounce buffer's)
T_A2A_CMA = 29  # an ALLTOALLV's block bytes from which it is read by cross-memory attach
T_TO, T_SENT, T_WANT = 30, 31, 32  # after COUNTS: the receiver, bytes sent, bytes expected
T_BASE = 33  # T_BASE + q: address of rank q's segment in this process; T_BASE + p + q: the
#             descriptor copy of rank q's current call (as found at the call's first read);
#             T_BASE + 2 p + q: rank q's process id; send_index(p) + b, recv_index(p) + b: an
#             alltoall's offsets of block b in the input and output (bytes, p + 1 each)


def send_index(p: int) -> int:
    """Index of an alltoall's first send offset in the private table of a team of ``p``."""
    return T_BASE + 3 * p


def recv_index(p: int) -> int:
    """Index of an alltoall's first receive offset in the private table."""
    return T_BASE + 4 * p + 1


def table_words(p: int) -> int:
    """Words of the private table of a team of ``p`` ranks."""
    return T_BASE + 5 * p + 2


def offsets_at(slot_bytes: int) -> int:
    """Byte offset of a rank's offset tables in its segment (after its slots)."""
    return DATA_OFFSET + 2 * SLOTS * slot_bytes


def window_bytes(slot_bytes: int, p: int) -> int:
    """Bytes of one rank's segment of the window: control, scratch, slots, offset tables,
    rounded up to a whole cache line. MPI lays the ranks' segments end to end (MPICH and Open
    MPI, unless asked for ``alloc_shared_noncontig``), so without the rounding every other
    rank's segment would start in the middle of a line at p = 2, 4 and 8 (tables of
    ``4 (p + 1)`` words): its counters would share lines, and its first words the line of the
    previous rank's tables."""
    return -(-(offsets_at(slot_bytes) + 2 * 2 * (p + 1) * 8) // 64) * 64


def kind(dtype_num: int, opcode: int, mode: int, m: int) -> int:
    """A call's kind as its descriptor publishes it (``D_KIND``)."""
    return dtype_num | (opcode << 8 | mode << 16 | m << 24)


def segment_bytes(requested: int, p: int) -> int:
    """Bytes of one slot for a requested segment size: room for one element of every rank,
    rounded up to a cache line."""
    need = max(int(requested), 8 * p)
    return -(-need // 64) * 64
