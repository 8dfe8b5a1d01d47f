"""Where the timeline's spans come from: wrappers installed on the library only while it records.

As ``_runtime/trace.py`` does for the shared-memory rounds, :func:`install` replaces a few
functions and methods with timing wrappers and :func:`uninstall` puts them back, so that with no
timeline the library runs its own code, untouched (zero cost, not one test per call). Each
wrapper reads :data:`ACTIVE` once, times the original and appends one span to the calling
thread's lane (:mod:`.recorder`). The hook points, by span category:

===========  ================================================  ===================================
category     wrapped                                           span
===========  ================================================  ===================================
call         ``_runtime.guard.Guard.run``                      one public call (blocking, or an
                                                               engine's run of a request): kind,
                                                               seq, count, dtype, bytes,
                                                               algorithm, strategy, codec
submit       ``nonblocking._submit``                           ``iallreduce(...)`` and the others
                                                               up to their return (checks,
                                                               queueing)
request      ``engine.requests.Request.complete``              the engine's run of a request
                                                               (``started`` to ``finished``), on
                                                               the thread that ran it: kind,
                                                               name (``name=``, the buckets of
                                                               ``DistributedOptimizer``), seq
wait         ``engine.requests.wait_for``                      a ``wait()``/``waitall()`` that
                                                               blocks
message      ``_runtime.guard.Guard.complete``                 each exchange round inside a call:
                                                               its messages' wait (send, recv,
                                                               sendrecv; "native": an MPI
                                                               collective), peers and bytes
shm          ``_runtime.shmem.team.Team.run``                  one pass through the node's
                                                               shared window, by mode
encode,      ``compressed._coding.TensorCoding.encode``,       a codec's work inside a compressed
decode,      ``.decode``, ``.aggregate_into``                  allreduce
aggregate
reduce       ``ops.Op.combine``                                a local reduction (a block of a
                                                               round)
===========  ================================================  ===================================

Blocking calls that repeat their last arguments run a remembered bound ``Guard.run``
(``api._Repeats``): installing and uninstalling forget those, so that they pick the wrapper up
(and drop it again).
"""

from __future__ import annotations

from typing import Any, Callable

from .recorder import Recorder, clock

__all__ = ["ACTIVE", "install", "uninstall"]

#: The recorder in use, or None: what every wrapper reads first.
ACTIVE: Recorder | None = None

#: (owner, attribute, original, wrapper) of every installed wrapper
_INSTALLED: list[tuple[Any, str, Any, Any]] = []


# -- the wrappers ----------------------------------------------------------------------------------
def _guard_run(plain: Callable) -> Callable:
    def run(self, name, fn, *args, timeout=None, call=None):
        rec = ACTIVE
        if rec is None:
            return plain(self, name, fn, *args, timeout=timeout, call=call)
        seen = [call]

        def traced(*a):  # sees the checked call the blocking entry points set on the guard
            try:
                return fn(*a)
            finally:
                seen[0] = self.call

        t0 = clock()
        error = None
        try:
            return plain(self, name, traced, *args, timeout=timeout, call=call)
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            t1 = clock()
            info = _describe(seen[0] if seen[0] is not None else args)
            info["seq"] = self.seq
            if error is not None:
                info["error"] = error
            rec.add("call", name, t0, t1, info)
    return run


def _guard_complete(plain: Callable) -> Callable:
    def complete(self, reqs, expect, peers, native=False, keep=()):
        rec = ACTIVE
        if rec is None:
            return plain(self, reqs, expect, peers, native, keep)
        t0 = clock()
        try:
            return plain(self, reqs, expect, peers, native, keep)
        finally:
            rec.add("message", "native" if native else _message_name(expect), t0, clock(),
                    (peers, expect))
    return complete


def _message_name(expect: list) -> str:
    sends = sum(e is None for e in expect)
    if sends == len(expect):
        return "send"
    return "recv" if sends == 0 else "sendrecv"


def _submit(plain: Callable) -> Callable:
    def submit(kind, cls, x, comm, validate, opts, name, *args):
        rec = ACTIVE
        if rec is None:
            return plain(kind, cls, x, comm, validate, opts, name, *args)
        t0 = clock()
        try:
            return plain(kind, cls, x, comm, validate, opts, name, *args)
        finally:
            rec.add("submit", kind, t0, clock(), None if name is None else {"name": name})
    return submit


def _request_complete(plain: Callable) -> Callable:
    def complete(self, error=None):
        rec = ACTIVE
        if rec is not None and self.started is not None and self.finished is not None:
            info = _describe(self.call)
            info["seq"] = self.seq
            if self.name is not None:
                info["name"] = self.name
            if error is not None:
                info["error"] = type(error).__name__
            rec.add("request", self.kind, self.started, self.finished, info)
        return plain(self, error)
    return complete


def _wait_for(plain: Callable) -> Callable:
    def wait_for(requests, timeout, satisfied):
        rec = ACTIVE
        if rec is None:
            return plain(requests, timeout, satisfied)
        t0 = clock()
        try:
            return plain(requests, timeout, satisfied)
        finally:
            names = [r.name if r.name is not None else f"{r.kind} #{r.seq}" for r in requests]
            rec.add("wait", "wait", t0, clock(), {"requests": names})
    return wait_for


def _team_run(plain: Callable) -> Callable:
    from .._runtime.shmem import layout

    modes = {layout.FUSED: "shm allreduce", layout.REPLICATED: "shm allreduce (replicated)",
             layout.REDUCE_SCATTER: "shm reduce-scatter", layout.ALLGATHER: "shm allgather"}

    def run(self, x, out, opcode, mode, *args, **kwargs):
        rec = ACTIVE
        if rec is None:
            return plain(self, x, out, opcode, mode, *args, **kwargs)
        t0 = clock()
        try:
            return plain(self, x, out, opcode, mode, *args, **kwargs)
        finally:
            rec.add("shm", modes.get(mode, "shm"), t0, clock(),
                    {"bytes": x.nbytes, "ranks": self.comm.size})
    return run


def _coding(category: str) -> Callable[[Callable], Callable]:
    def make(plain: Callable) -> Callable:
        def method(self, *args, **kwargs):
            rec = ACTIVE
            if rec is None:
                return plain(self, *args, **kwargs)
            t0 = clock()
            try:
                return plain(self, *args, **kwargs)
            finally:
                rec.add(category, category, t0, clock())
        return method
    return make


def _combine(plain: Callable) -> Callable:
    def combine(self, lower, higher, out):
        rec = ACTIVE
        if rec is None:
            return plain(self, lower, higher, out)
        t0 = clock()
        try:
            return plain(self, lower, higher, out)
        finally:
            rec.add("reduce", "reduce", t0, clock(), (self.name, out.nbytes))
    return combine


# -- what a call is --------------------------------------------------------------------------------
_NAMES: dict[Any, str] = {}  # algorithm and strategy functions -> their catalogue names


def _names() -> dict[Any, str]:
    if not _NAMES:
        from ..algorithms import ALGORITHMS
        from ..blocks import ALLGATHER, BCAST, REDUCE, REDUCE_SCATTER
        from ..algorithms import auto
        from ..compressed import STRATEGIES

        for table in (ALGORITHMS, auto._ALL, ALLGATHER, BCAST, REDUCE, REDUCE_SCATTER,
                      STRATEGIES):
            for name, fn in table.items():
                if name != "auto":
                    _NAMES.setdefault(fn, name)
    return _NAMES


def _describe(what: Any) -> dict[str, Any]:
    """The arguments of a call span: from a checked call object (``AllreduceCall`` ...), or the
    arguments of a repeated call (``src, dst, op, fn, ...``). Holds nothing of the arrays."""
    import numpy as np

    info: dict[str, Any] = {}
    if isinstance(what, tuple):  # a repeated allreduce: run_allreduce's arguments
        if what and isinstance(what[0], np.ndarray):
            src = what[0]
            info.update(count=int(src.size), dtype=str(src.dtype), bytes=int(src.nbytes))
        if len(what) > 3:
            name = _names().get(what[3])
            if name is not None:
                info["algorithm"] = name
        return info
    if what is None:
        return info
    src = getattr(what, "src", None)
    if src is None:
        src = getattr(what, "buf", None)
    if src is not None and hasattr(src, "nbytes"):
        info.update(count=int(src.size), dtype=str(src.dtype), bytes=int(src.nbytes))
    sig = getattr(what, "sig", None)
    if isinstance(sig, dict) and "codec" in sig:  # a compressed allreduce
        info.update(codec=sig["codec"], strategy=sig["strategy"], step=sig["step"])
        algorithm = getattr(what, "algorithm", None)
    else:
        algorithm = _names().get(getattr(what, "fn", None)) or getattr(what, "algorithm", None)
    if isinstance(algorithm, str):
        info["algorithm"] = algorithm
    return info


# -- installing ------------------------------------------------------------------------------------
def _points() -> list[tuple[Any, str, Callable[[Callable], Callable]]]:
    from .. import nonblocking
    from .._runtime.guard import Guard
    from .._runtime.shmem.team import Team
    from ..compressed._coding import TensorCoding
    from ..engine import requests
    from ..ops import Op

    return [(Guard, "run", _guard_run), (Guard, "complete", _guard_complete),
            (nonblocking, "_submit", _submit), (requests.Request, "complete", _request_complete),
            (requests, "wait_for", _wait_for), (Team, "run", _team_run),
            (TensorCoding, "encode", _coding("encode")),
            (TensorCoding, "decode", _coding("decode")),
            (TensorCoding, "aggregate_into", _coding("aggregate")),
            (Op, "combine", _combine)]


def _forget_repeats() -> None:
    from .. import api

    api._REPEATS.entries.clear()


def install(recorder: Recorder) -> None:
    """Record into ``recorder`` from now on (installs the wrappers, once)."""
    global ACTIVE
    if not _INSTALLED:
        for owner, attr, make in _points():
            plain = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
            wrapper = make(plain)
            setattr(owner, attr, wrapper)
            _INSTALLED.append((owner, attr, plain, wrapper))
        _forget_repeats()
    ACTIVE = recorder


def uninstall() -> None:
    """Stop recording and put the originals back (a wrapper that something else has replaced
    since, such as ``trace.recording``'s, is left in place: it sees ACTIVE None and passes
    through)."""
    global ACTIVE
    ACTIVE = None
    for owner, attr, plain, wrapper in reversed(_INSTALLED):
        current = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if current is wrapper:
            setattr(owner, attr, plain)
    _INSTALLED.clear()
    _forget_repeats()
