"""What this process did last, from its flight recorders, as a few integers and back.

A stall report (:mod:`collectives.engine.control`) asks every other rank for its status; with it
each rank answers with its *last call*: of all its communicators' guards (:mod:`.guard`), the one
running now, else the one that ended last. Four int64 words travel: the kind's index in
:data:`KINDS` (-1: no call yet, or a kind not in the table), the call number, the state
(:data:`STATES`) and the milliseconds since the call ended (running: -1). :func:`describe`
turns them into ``in allreduce #57`` or ``its last call, allreduce #57, finished 3.1 s ago``.
"""

from __future__ import annotations

from . import flight
from .guard import live_guards

__all__ = ["KINDS", "STATES", "encode", "describe"]

#: The calls a guard runs, by index (the blocking calls and the engine's operations).
KINDS = ("allreduce", "reduce_scatter", "allgather", "bcast", "reduce", "compressed_allreduce",
         "iallreduce", "ireduce_scatter", "iallgather", "ibcast", "ireduce",
         "icompressed_allreduce", "alltoall", "barrier", "gather", "scatter",
         "compressed_reduce_scatter", "compressed_allgather", "icompressed_reduce_scatter",
         "icompressed_allgather")
STATES = (flight.STARTED, flight.FINISHED, flight.FAILED)
_NONE = (-1, -1, -1, -1)


def encode() -> tuple[int, int, int, int]:
    """This process's last call as (kind index, call number, state index, ms since it ended);
    (-1, -1, -1, -1) when no recorder has a call. Reads the records without locks (it runs on
    an engine's thread while others record): a record changing meanwhile gives a stale answer,
    never an error."""
    try:
        best, best_end = None, float("-inf")
        for guard in live_guards():
            records = guard.records
            if records is None or guard.seq < guard.first:
                continue
            rec = records[guard.seq % len(records)]
            if rec.seq != guard.seq:
                continue
            if rec.state == flight.STARTED:  # running: that is what this rank does now
                best, best_end = rec, float("inf")
                break
            if rec.t1 > best_end:
                best, best_end = rec, rec.t1
        if best is None:
            return _NONE
        kind = KINDS.index(best.kind) if best.kind in KINDS else -1
        ago = -1 if best_end == float("inf") else int((flight.clock() - best_end) * 1000)
        return kind, best.seq, STATES.index(best.state), ago
    except Exception:  # noqa: BLE001 - a status answer must never fail
        return _NONE


def describe(words: tuple[int, ...]) -> str:
    """``in allreduce #57`` / ``its last call, allreduce #57, finished 3.1 s ago`` / ``no call
    yet`` for the words of :func:`encode`."""
    kind, seq, state, ago = (int(w) for w in words)
    if state < 0 or state >= len(STATES):
        return "no call recorded"
    what = f"{KINDS[kind] if 0 <= kind < len(KINDS) else 'a call'} #{seq}"
    if STATES[state] == flight.STARTED:
        return f"in {what}"
    ended = "failed" if STATES[state] == flight.FAILED else "finished"
    return f"its last call, {what}, {ended} {ago / 1000:.1f} s ago"
