"""The signature check of the MPI library's own collectives ("native"): a count, dtype or op
that differs across ranks is an error on every rank, never a matched, truncated MPI collective.

MPI leaves a collective whose ranks pass different counts, datatypes or operations undefined,
and MPICH returns a silent wrong answer. The hand-written algorithms receive exact sizes (the
guard's check, ``guard.py``); a native operation cannot. So before a native operation runs, each
rank makes sure that its *signature* (the collective, count, dtype, op, root, block counts:
:func:`key`) is the one every rank agreed on last on this context (``Context.agreed``); if not,
the ranks agree on it first: one ``MPI_Iallreduce`` (MAX) of ``[h, -h]``, two int64 where ``h``
is a 62-bit hash of the signature, on the context's control communicator (``Context.control_comm``,
a duplicate of its own on which nothing else runs). Equal maxima mean one signature everywhere,
which becomes the agreed one; otherwise the ranks exchange their signatures (an ``allgather`` on
the same communicator, every rank being there) and each raises the same ``ValueError`` naming
every rank's values, as ``validate=True`` would (``validate.verdict``).

Why this can never let a mismatch through: a rank skips the check only for the signature that
every rank agreed on at the last check (checks are collectives, so the *k*-th check is the same
on every rank and so is its verdict). If all ranks skip, they all run that signature. If one rank
skips and runs the native operation while another checks, the two wait on different
communicators: the checking rank, still waiting after ``guard.CHECK_PATIENCE``, sends a check
note, and the rank that skipped raises ``ValueError`` on reading it, which its notice makes the
error of every rank (``guard.py``, "Check notes"); where no note can tell (a check on part of
the call's ranks, abort mode), each waits until the call's deadline (``Options.timeout``) and
the call fails with ``TimeoutError`` on every rank. Then native is retired on the communicator
(``guard.py``) and the hand-written replacements, with their exact sizes, run instead; a
retired communicator skips the check. A
repeat of a remembered call (``api._Repeats``, a plan, the lanes) compares one reference
(``ctx.agreed is key``) and skips the check; a loop that alternates between two signatures checks
at every call (docs/reliability.md, docs/benchmarks/overhead.md).

Under a guard (``on_error="raise"``) the check is non-blocking and waited for like every message
(notices, the deadline); outside one (``on_error="abort"``, an algorithm called directly) it is a
blocking ``MPI_Allreduce``, and a mismatch raises there (in abort mode: the job ends). The
progress engine's context (the non-blocking forms) checks on the engine's control communicator
(point-to-point status queries only otherwise), hierarchical's cross-node contexts on a
duplicate of their own. The engine's named stream has none and needs none: its negotiation
(``engine/named.py``) compares every name's signature across ranks before the name runs.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from .guard import CHECK_PATIENCE
from .validate import verdict
from .context import Context

__all__ = ["key", "agree", "FIELDS"]

#: the fields of a signature after the collective's name, in :func:`key`'s order
FIELDS = ("count", "dtype", "op", "root", "counts")
#: every signature made, by itself: equal signatures are one object, compared by identity
_KEYS: dict[tuple, tuple] = {}
#: each signature's hash (:func:`_hash`), made once
_HASHES: dict[tuple, int] = {}
#: signatures kept at most (sequence lengths that change at every step make new ones)
_MAX_KEYS = 4096


def key(kind: str, count: int | None, dtype: np.dtype, op: str | None = None, root: int | None = None,
        counts: tuple | None = None) -> tuple:
    """The signature of one native operation, as one shared object for equal values (so that
    ``ctx.agreed is key(...)`` says whether it was agreed)."""
    t = (kind, count, dtype, op, root, counts)
    if len(_KEYS) >= _MAX_KEYS and t not in _KEYS:  # a workload of ever new counts: start
        _KEYS.clear()                                 # again (an equal signature made anew
        _HASHES.clear()                               # is agreed again: one more check)
    return _KEYS.setdefault(t, t)


def _hash(sig: tuple) -> int:
    """A 62-bit hash of ``sig``, the same in every process (Python's ``hash`` of a string is
    not), so that both it and its negation fit an int64."""
    h = _HASHES.get(sig)
    if h is None:
        import hashlib

        digest = hashlib.blake2b(repr(sig).encode("utf-8"), digest_size=8).digest()
        h = _HASHES[sig] = int.from_bytes(digest, "little") >> 2
    return h


def _fields(sig: tuple) -> dict[str, Any]:
    """``sig`` as the signature dictionary of ``validate.verdict`` (its unset fields left out)."""
    named = {"collective": sig[0]}
    named.update((f, v) for f, v in zip(FIELDS, sig[1:]) if v is not None)
    return named


def agree(ctx: Context, sig: tuple) -> None:
    """Make ``sig`` the signature every rank of ``ctx`` agreed on, or raise the ``ValueError``
    that every rank raises (the module docstring). Collective on ``ctx.control_comm``; a no-op
    on a context without one, and under a guard that has retired native."""
    control = ctx.control_comm
    if control is None:
        return
    before, ctx.agreed = ctx.agreed, None  # until this check says otherwise
    h = _hash(sig)
    buf = np.array([h, -h], dtype=np.int64)
    guard = ctx.active
    if guard is None:  # abort mode, or an algorithm called directly: blocking
        control.Allreduce(MPI.IN_PLACE, [buf, MPI.INT64_T], MPI.MAX)
    elif not guard.native(lambda: _start(guard, control, buf, before is not None), _nothing,
                          (buf,), ctx.started, 1):
        return  # native is retired: the hand-written replacement checks sizes itself
    if int(buf[0]) == h and -int(buf[1]) == h:
        ctx.agreed = sig
        return
    everyone = control.allgather(_fields(sig))  # every rank saw the same maxima
    error = verdict(everyone[0]["collective"], [(s, None) for s in everyone])
    if error is None:  # pragma: no cover - a hash collision
        raise ValueError(f"{sig[0]}: arguments differ across ranks (their hashes differ)")
    if guard is not None and guard.size != control.size:
        # checked on a part of the call's ranks only (hierarchical's cross-node ranks): raised
        # as this rank's own error, which the guard tells the call's other ranks
        raise type(error).__bases__[-1](str(error))
    raise error


def _start(guard: Any, control: MPI.Comm, buf: np.ndarray, repeatable: bool) -> Any:
    """Start the check's ``MPI_Iallreduce`` (``guard.native`` counts it in the context's
    ``started[1]``: a release compares the counts, ``_runtime/release.py``); one that has not
    finished within ``guard.CHECK_PATIENCE`` seconds while a signature was agreed
    (``repeatable``: a rank may be repeating it instead of checking) sends check notes
    (``guard.py``). Checks on a part of the call's ranks (hierarchical's cross-node ranks) send
    none."""
    k = guard.begin_check()
    req = control.Iallreduce(MPI.IN_PLACE, [buf, MPI.INT64_T], MPI.MAX)
    if repeatable and control.size == guard.size:
        deadline = time.monotonic() + CHECK_PATIENCE
        while not req.Get_status():  # (Test would free a finished request)
            if time.monotonic() > deadline:
                guard.tell_checking(k)
                break
            time.sleep(0)
    return req


def _nothing() -> None:
    """The check's "fallback" under a retired guard: none is needed."""
