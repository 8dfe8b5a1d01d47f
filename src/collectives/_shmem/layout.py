"""The shared-memory protocol's numbers, shared by the Python side and the Numba kernels.

Nothing here imports Numba. ``team.py`` explains the protocol; this module only names the words.

A team's window gives every rank one segment (``Allocate_shared``), laid out as

- ``[0, CTRL_BYTES)``: the rank's control block of int64 words. Words ``X_REGION`` ...
  ``OUT_OFFSET`` describe where this call's input and output live (two copies, for odd and even
  calls, so that a rank may publish its next call's while a slower one still reads this one's);
  ``READY``, ``DONE`` and ``FREED`` are its three round counters, each on its own 64-byte cache
  line so that a rank polling one counter does not slow the writer of another.
- ``[SCRATCH_OFFSET, DATA_OFFSET)``: scratch that only this rank touches (the L1 block in which
  the fold kernel combines, and the operand address lists).
- ``[DATA_OFFSET, DATA_OFFSET + SLOTS * slot_bytes)``: the rank's input slots, where it stages
  segments of its input for the ranks that reduce them;
- then ``SLOTS`` output slots, where it puts the segments it reduced for the ranks that copy them.

Each process also keeps a private int64 array, the *table* (``T_*`` indices), holding its rank,
the team size, the slot geometry, the round counter and every rank's segment address as mapped in
this process, plus the cursor that lets a call that had to wait resume where it stopped.
"""

from __future__ import annotations

__all__ = [
    "SLOTS", "CTRL_BYTES", "DESCRIPTOR", "FOLD_BLOCK", "MAX_TEAM", "SCRATCH_OFFSET",
    "SCRATCH_BYTES",
    "DATA_OFFSET", "X_REGION", "X_OFFSET", "OUT_REGION", "OUT_OFFSET",
    "READY", "DONE", "FREED", "STAGED", "FUSED", "REDUCE_SCATTER", "ALLGATHER", "REPLICATED",
    "OPCODES",
    "STREAM_BYTES", "T_ME", "T_P", "T_SLOTS", "T_SLOT_BYTES", "T_SEQ", "T_SPIN", "T_PHASE",
    "T_TS", "T_TF",
    "T_TC", "T_T0", "T_TL", "T_CALL", "T_STREAM", "T_BASE", "segment_bytes",
]

#: Slots per rank and direction: a rank may stage round t while round t - SLOTS is the oldest
#: one any rank may still be reading.
SLOTS = 2
CTRL_BYTES = 256
#: Elements the fold kernel combines at a time (16 KiB of float64: stays in L1).
FOLD_BLOCK = 2048
#: Most ranks a team may have (the operand address lists live in the scratch area).
MAX_TEAM = 1024
SCRATCH_OFFSET = 4096
SCRATCH_BYTES = -(-(FOLD_BLOCK * 8 + (2 * MAX_TEAM + 1) * 8) // 4096) * 4096
DATA_OFFSET = SCRATCH_OFFSET + SCRATCH_BYTES  # slots start on their own page

# control words (int64 index into a rank's control block); the descriptor of call c starts
# at word DESCRIPTOR * (c % 2)
X_REGION, X_OFFSET, OUT_REGION, OUT_OFFSET = 0, 1, 2, 3
DESCRIPTOR = 4
READY = 8    # last round whose input segments this rank has staged (or: all, at arrival)
DONE = 16    # last round this rank has reduced (it has stopped reading inputs of that round)
FREED = 24   # last round this rank has copied out (it has stopped reading output slots of it)

#: From this many bytes (default of the table's ``T_STREAM``), results are copied out with
#: non-temporal stores.
STREAM_BYTES = 8 << 20

#: Region index meaning "not in a shared buffer: staged through the slots".
STAGED = -1

# modes of one engine call
FUSED = 0           # allreduce: reduce my block from every input, every rank copies every block
REDUCE_SCATTER = 1  # the first m ranks reduce their block into their own output only
ALLGATHER = 2       # the first m ranks hand out their block of their own input
REPLICATED = 3      # allreduce of a short vector: every rank reduces all of it from every input

#: Reduction codes of the kernels, by ``collectives.ops`` name ("avg" sums; the caller divides).
OPCODES = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 0}

# the private table
T_ME, T_P, T_SLOTS, T_SLOT_BYTES, T_SEQ, T_SPIN = 0, 1, 2, 3, 4, 5
T_PHASE, T_TS, T_TF, T_TC, T_T0, T_TL, T_CALL, T_STREAM = 6, 7, 8, 9, 10, 11, 12, 13
T_BASE = 16  # T_BASE + q: address of rank q's segment in this process


def segment_bytes(requested: int, p: int) -> int:
    """Bytes of one slot for a requested segment size: room for one element of every rank,
    rounded up to a cache line."""
    need = max(int(requested), 8 * p)
    return -(-need // 64) * 64
