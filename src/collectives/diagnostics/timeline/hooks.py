"""Where the timeline's spans come from: wrappers installed on the library only while it records.

As ``_runtime/trace.py`` does for the shared-memory rounds, :func:`install` replaces a few
functions and methods with timing wrappers and :func:`uninstall` puts them back, so that with no
timeline the library runs its own code, untouched. Each wrapper reads :data:`ACTIVE` once,
times the original and appends one span to the calling thread's lane (:mod:`.recorder`). Call
spans are the exception: ``Guard.run`` and abort mode's ``Runner.run`` already read the clock
at each call's end and describe the call for the flight recorder (``_runtime/flight.py``), so
they give the timeline those (``flight.SPANS``, which :func:`install` sets to :func:`_call`)
and a wrapper around them would only add a second Python frame per call; off, that costs them
one test of the slot per call. Local reductions likewise: ``ops.Op.combine`` appends its own
span while ``ops.RECORDER`` holds the recorder. The hook points, by span category:

===========  ================================================  ===================================
category     wrapped                                           span
===========  ================================================  ===================================
call         (given by ``_runtime.guard.Guard.run`` and        one public call (blocking, or an
             ``_runtime.fatal.Runner.run``, abort mode's)      engine's run of a request): kind,
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
shm          ``_runtime.shmem.team.Team.run``,                 one pass through the node's
             ``.run_compiled`` (a repeated call's lane)        shared window, by mode
encode,      ``compressed._coding.TensorCoding.encode``,       a codec's work inside a compressed
decode,      ``.decode``, ``.aggregate_into``                  allreduce
aggregate
reduce       (taken by ``ops.Op.combine`` itself)              a local reduction (a block of a
                                                               round)
user, codec  (:func:`collectives.timeline.record`)             the program's own phases (the SGD
                                                               driver's and the PyTorch trainer's
                                                               compute, step, update; the
                                                               driver's codec methods)
===========  ================================================  ===================================
"""

from __future__ import annotations

from typing import Any, Callable

from ... import ops
from ..._runtime import flight
from .recorder import Recorder, clock

__all__ = ["ACTIVE", "install", "uninstall"]

#: The recorder in use, or None: what every wrapper reads first.
ACTIVE: Recorder | None = None

#: (owner, attribute, original, wrapper) of every installed wrapper
_INSTALLED: list[tuple[Any, str, Any, Any]] = []


# -- the wrappers ----------------------------------------------------------------------------------
def _call(name: str, t0: float, t1: float, seq: int, what: tuple | None, call: Any,
          error: str | None) -> None:
    """A call's span, given by ``Guard.run`` and abort mode's ``Runner.run`` at its end
    (``_runtime.flight.SPANS``): its times, number, the flight recorder's description of it
    (``what``, or None) and its error's type. Compressed calls are read here instead
    (:func:`_summary`: codec, strategy and step, which the description does not hold)."""
    rec = ACTIVE
    if rec is None:
        return
    if what is None or name in _SIGNED:
        what = _summary(call)
    if error is not None:
        what = (None, error, what)
    try:
        events = rec.local.events
    except AttributeError:
        events = rec.lane().events
    events.append(("call", name, t0, t1, what, seq))


#: call kinds whose span needs what the flight record does not hold (codec, strategy, step)
_SIGNED = frozenset({"compressed_allreduce"})


def _guard_complete(plain: Callable) -> Callable:
    def complete(self, reqs, expect, peers, native=False, keep=()):
        rec = ACTIVE
        if rec is None:
            return plain(self, reqs, expect, peers, native, keep)
        t0 = clock()
        try:
            return plain(self, reqs, expect, peers, native, keep)
        finally:
            t1 = clock()
            try:
                events = rec.local.events
            except AttributeError:
                events = rec.lane().events
            # named at write time (send, recv, sendrecv: .chrome) unless native; the peers,
            # then what each expected, in one tuple of numbers (which the collector stops
            # tracking, where lists would stay tracked and every full collection would walk them)
            events.append(("message", "native" if native else "", t0, t1, (*peers, *expect),
                           None))
    return complete


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
            rec.add("request", self.kind, self.started, self.finished,
                    (self.name, None if error is None else type(error).__name__,
                     _summary(self.call)), self.seq)
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
            rec.add("wait", "wait", t0, clock(), {"requests": tuple(names)})
    return wait_for


def _method_span(category: str, name_args: Callable) -> Callable[[Callable], Callable]:
    """A wrapper of a method: one span of ``category`` per call while a timeline records, named
    with its arguments by ``name_args(self, args)`` (its name and its span's arguments)."""
    def make(plain: Callable) -> Callable:
        def method(self, *args, **kwargs):
            rec = ACTIVE
            if rec is None:
                return plain(self, *args, **kwargs)
            t0 = clock()
            try:
                return plain(self, *args, **kwargs)
            finally:
                t1 = clock()
                name, span_args = name_args(self, args)
                rec.add(category, name, t0, t1, span_args)
        return method
    return make


def _team_pass(first: int) -> Callable[[Callable], Callable]:
    """``Team.run`` (``first`` 0) or ``Team.run_compiled`` (1: after the entry, a repeated
    call's lane): one span per pass through the window, by mode. ``x`` and ``mode`` are the
    arguments ``first`` and ``first + 3``, which every caller passes by position."""
    from ..._runtime.shmem import layout

    modes = {layout.FUSED: "shm allreduce", layout.REPLICATED: "shm allreduce (replicated)",
             layout.REDUCE_SCATTER: "shm reduce-scatter", layout.ALLGATHER: "shm allgather"}
    return _method_span("shm", lambda self, args: (modes.get(args[first + 3], "shm"),
                                                   (args[first].nbytes, self.comm.size)))


def _coding(category: str) -> Callable[[Callable], Callable]:
    return _method_span(category, lambda self, args: (category, None))


# -- what a call is --------------------------------------------------------------------------------
_NAMES: dict[Any, str] = {}  # algorithm and strategy functions -> their catalogue names


def _names() -> dict[Any, str]:
    if not _NAMES:
        from ...algorithms import ALGORITHMS
        from ...blocks import ALLGATHER, BCAST, REDUCE, REDUCE_SCATTER
        from ...algorithms import auto
        from ...compressed import STRATEGIES

        for table in (ALGORITHMS, auto._ALL, ALLGATHER, BCAST, REDUCE, REDUCE_SCATTER,
                      STRATEGIES):
            for name, fn in table.items():
                if name != "auto":
                    _NAMES.setdefault(fn, name)
    return _NAMES


def _summary(what: Any) -> tuple | None:
    """What a call span records of the call, made a dict by :func:`describe` at write time:
    ``(dtype, bytes, algorithm name, compressed signature)`` from a checked call object
    (``AllreduceCall`` ...), read by one function per class (:func:`_reader`); or None. Holds
    only values the garbage collector does not track (no arrays, no functions), so that a long
    timeline costs its full collections nothing."""
    read = _READERS.get(type(what))
    if read is None:
        if what is None:
            return None
        read = _READERS[type(what)] = _reader(type(what))
    try:
        return read(what)
    except (AttributeError, TypeError):  # no array (yet)
        return None


def _reader(cls: type) -> Callable[[Any], tuple | None]:
    """How :func:`_summary` reads a call of class ``cls``."""
    if "__getattr__" in vars(cls):  # a wrapper (nonblocking._OnDevice): ask the instance
        return lambda what: (what.src.dtype, what.src.nbytes, None, None)
    names: set[str] = set()
    for c in cls.__mro__:
        names.update(getattr(c, "__slots__", ()))
        names.update(vars(c))
    if "sig" in names:  # compressed: the key names the tensor
        def read_compressed(what: Any) -> tuple:
            src, key = what.src, what.key
            return src.dtype, src.nbytes, what.algorithm, \
                what.sig if key is None else {**what.sig, "key": str(key)}
        return read_compressed
    src_attr = "src" if "src" in names else ("buf" if "buf" in names else None)
    if src_attr is None:
        return lambda what: None
    table = _names()
    if "fn" in names:
        if src_attr == "src":
            return lambda what: (what.src.dtype, what.src.nbytes,
                                 table.get(what.fn) or what.algorithm, None)
        return lambda what: (what.buf.dtype, what.buf.nbytes,
                             table.get(what.fn) or what.algorithm, None)
    return lambda what: (getattr(what, src_attr).dtype, getattr(what, src_attr).nbytes,
                         getattr(what, "algorithm", None), None)


#: call class -> how :func:`_summary` reads it (made once per class)
_READERS: dict[type, Callable[[Any], tuple | None]] = {}


def describe(seq: int | None, args: tuple | None) -> dict[str, Any]:
    """The ``args`` of a call or request span, from what the wrapper recorded: the call number
    ``seq`` and ``args``, what the call was, or ``(request name, error type, what the call was)``
    for requests and failed calls. What the call was is :func:`_summary`'s ``(dtype, bytes,
    algorithm, signature)``, or the flight recorder's description of the call ``(name, count,
    dtype, op, algorithm)`` (``_runtime/flight.py``), or None."""
    info: dict[str, Any] = {}
    name = error = None
    what = args
    if args is not None and len(args) == 3:
        name, error, what = args
    if name is not None:
        info["name"] = name
    count = algorithm = sig = None
    if what is not None and len(what) == 5:  # the flight recorder's
        count, dtype, algorithm = what[1], what[2], what[4]
        nbytes = None if count is None else count * dtype.itemsize
    elif what is not None:
        dtype, nbytes, algorithm, sig = what
        count = nbytes // dtype.itemsize
    if count is not None:
        info.update(count=int(count), dtype=str(dtype), bytes=int(nbytes))
        if sig is not None:
            info.update(codec=sig["codec"], strategy=sig["strategy"], step=sig["step"])
            if "key" in sig:
                info["key"] = sig["key"]
        if algorithm is not None:
            info["algorithm"] = algorithm
    info["seq"] = seq
    if error is not None:
        info["error"] = error
    return info


# -- installing ------------------------------------------------------------------------------------
def _points() -> list[tuple[Any, str, Callable[[Callable], Callable]]]:
    from ...engine import nonblocking
    from ..._runtime.guard import Guard
    from ..._runtime.shmem.team import Team
    from ...compressed.api import TensorCoding  # (defined in compressed._coding)
    from ...engine import requests
    return [(Guard, "complete", _guard_complete),
            (nonblocking, "_submit", _submit), (requests.Request, "complete", _request_complete),
            (requests, "wait_for", _wait_for), (Team, "run", _team_pass(0)),
            (Team, "run_compiled", _team_pass(1)),
            (TensorCoding, "encode", _coding("encode")),
            (TensorCoding, "decode", _coding("decode")),
            (TensorCoding, "aggregate_into", _coding("aggregate"))]


def install(recorder: Recorder) -> None:
    """Record into ``recorder`` from now on (installs the wrappers, once)."""
    global ACTIVE
    if not _INSTALLED:
        for owner, attr, make in _points():
            plain = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
            wrapper = make(plain)
            setattr(owner, attr, wrapper)
            _INSTALLED.append((owner, attr, plain, wrapper))
    ACTIVE = recorder
    flight.SPANS[0] = _call
    ops.RECORDER[0] = recorder  # reduce spans: Op.combine takes them itself


def uninstall() -> None:
    """Stop recording and put the originals back (a wrapper that something else has replaced
    since, such as ``trace.recording``'s, is left in place: it sees ACTIVE None and passes
    through)."""
    global ACTIVE
    ACTIVE = None
    flight.SPANS[0] = None
    ops.RECORDER[0] = None
    for owner, attr, plain, wrapper in reversed(_INSTALLED):
        current = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if current is wrapper:
            setattr(owner, attr, plain)
    _INSTALLED.clear()
