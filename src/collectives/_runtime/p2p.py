"""Point-to-point helpers: buffer-based (no pickling), every array sent as raw bytes.

Sending bytes keeps the hand-written algorithms independent of which datatypes the MPI library has
(MPI has no float16); the reductions happen locally in NumPy (or CuPy). Device (CuPy) arrays go to
MPI through ``_runtime/device.py``: directly with CUDA-aware MPI, else staged through pinned host
memory, the stream synchronised first either way. NumPy arrays take the first branch of each
function.

Inside a public call every message carries the call's tag and every wait is the guard's
(``_runtime/guard.py``): it also ends on a notice that another rank's call failed, and a receive of
another size than expected raises ValueError ("count or dtype differs across ranks").

Each operation is observed at the point ``p2p`` (:mod:`.observe`; ``_runtime/trace.py``'s recording
registers there) before it is posted; with no observer the cost is one test.
"""

from __future__ import annotations

import numpy as np
from compress.arrays import is_numpy as _host
from mpi4py import MPI

from . import device as _device
from .guard import Guard
from ..observe import OBSERVERS as _OBSERVED
from .traffic import TRAFFIC

__all__ = ["send", "recv", "sendrecv", "exchange", "post", "complete", "cancel"]

TAG = 7117  # outside a public call (algorithms run directly); inside, the call's own tag


def _observed(comm: MPI.Comm, dest: int, sent: int, source: int, received: int) -> None:
    """Tell the observers of ``p2p`` of a send of ``sent`` bytes to ``dest`` and/or a receive
    of ``received`` bytes from ``source`` (-1: none) on ``comm``."""
    for observe in _OBSERVED.p2p:
        observe(comm, dest, sent, source, received)


def send(comm: MPI.Comm, a: np.ndarray, dest: int, guard: Guard | None) -> None:
    TRAFFIC.add(a.nbytes)
    if _OBSERVED.p2p:
        _observed(comm, dest, a.nbytes, -1, 0)
    buf = a if _host(a) else _device.to_mpi(a, "send")  # device: CUDA-aware or staged
    if guard is None:
        comm.Send([buf, MPI.BYTE], dest, TAG)
        return
    guard.complete([comm.Isend([buf, MPI.BYTE], dest, guard.tag)], [None], [dest])


def recv(comm: MPI.Comm, a: np.ndarray, source: int, guard: Guard | None) -> None:
    if _OBSERVED.p2p:
        _observed(comm, -1, 0, source, a.nbytes)
    target = a if _host(a) else _device.from_mpi(a, "recv")
    if guard is None:
        comm.Recv([target, MPI.BYTE], source, TAG)
    else:  # exactly a.nbytes: a longer or shorter message is an error (counts differ)
        guard.complete([comm.Irecv([target, MPI.BYTE], source, guard.tag)], [a.nbytes],
                       [source])
    if target is not a:
        _device.landed(a, target)


def sendrecv(comm: MPI.Comm, a: np.ndarray, dest: int, b: np.ndarray, source: int,
             guard: Guard | None) -> None:
    """Send ``a`` to ``dest`` while receiving ``b`` from ``source``."""
    TRAFFIC.add(a.nbytes)
    if _OBSERVED.p2p:
        _observed(comm, dest, a.nbytes, source, b.nbytes)
    if _host(a) and _host(b):
        if guard is None:
            comm.Sendrecv([a, MPI.BYTE], dest, TAG, [b, MPI.BYTE], source, TAG)
            return
        tag = guard.tag
        guard.complete([comm.Irecv([b, MPI.BYTE], source, tag),
                        comm.Isend([a, MPI.BYTE], dest, tag)], [b.nbytes, None], [source, dest])
        return
    target = b if _host(b) else _device.from_mpi(b, "recv")
    out = a if _host(a) else _device.to_mpi(a, "send")
    if guard is None:
        comm.Sendrecv([out, MPI.BYTE], dest, TAG, [target, MPI.BYTE], source, TAG)
    else:
        guard.complete([comm.Irecv([target, MPI.BYTE], source, guard.tag),
                        comm.Isend([out, MPI.BYTE], dest, guard.tag)], [b.nbytes, None],
                       [source, dest])
    if target is not b:
        _device.landed(b, target)


def exchange(comm: MPI.Comm, sends: list[tuple[np.ndarray, int]],
             recvs: list[tuple[np.ndarray, int]], guard: Guard | None) -> None:
    """Send each ``(array, dest)`` of ``sends`` while receiving each ``(array, source)`` of
    ``recvs``, all at once (the neighbor collectives: one message to or from each neighbor).
    NumPy arrays only; an array may be sent to several ranks."""
    complete([post(comm, sends, recvs, guard)], guard)


Posted = tuple[list, list, list]  # (requests, bytes each receive expects / None, peers)


def post(comm: MPI.Comm, sends: list[tuple[np.ndarray, int]],
         recvs: list[tuple[np.ndarray, int]], guard: Guard | None) -> Posted:
    """:func:`exchange`'s messages posted, not waited for: hand the result to :func:`complete`
    (several postings, on several communicators, may complete together), or to :func:`cancel`
    if the call fails before that."""
    for a, dest in sends:
        TRAFFIC.add(a.nbytes)
        if _OBSERVED.p2p:
            _observed(comm, dest, a.nbytes, -1, 0)
    if _OBSERVED.p2p:
        for b, source in recvs:
            _observed(comm, -1, 0, source, b.nbytes)
    tag = TAG if guard is None else guard.tag
    reqs = [comm.Irecv([b, MPI.BYTE], source, tag) for b, source in recvs] + \
        [comm.Isend([a, MPI.BYTE], dest, tag) for a, dest in sends]
    return (reqs, [b.nbytes for b, _ in recvs] + [None] * len(sends),
            [source for _, source in recvs] + [dest for _, dest in sends])


def complete(posted: list[Posted], guard: Guard | None) -> None:
    """Wait for every message of ``posted`` (:func:`post`'s results) under ``guard``."""
    reqs = [r for p in posted for r in p[0]]
    if guard is None:
        MPI.Request.Waitall(reqs)
        return
    guard.complete(reqs, [e for p in posted for e in p[1]], [q for p in posted for q in p[2]])


def cancel(posted: Posted) -> None:
    """Withdraw posted receives (``post(comm, [], recvs, guard)``) of a call that fails before
    completing them, so that no later call's message lands in them."""
    for req in posted[0]:
        req.Cancel()
        try:
            req.Wait()
        except MPI.Exception:  # it had matched a message of another size: discarded
            pass
