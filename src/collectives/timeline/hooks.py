"""Where the timeline's spans come from: wrappers installed on the library only while it records.

As ``_runtime/trace.py`` does for the shared-memory rounds, :func:`install` replaces a few
functions and methods with timing wrappers and :func:`uninstall` puts them back, so that with no
timeline the library runs its own code, untouched (zero cost, not one test per call). Each
wrapper reads :data:`ACTIVE` once, times the original and appends one span to the calling
thread's lane (:mod:`.recorder`). The hook points, by span category:

===========  ================================================  ===================================
category     wrapped                                           span
===========  ================================================  ===================================
call         ``_runtime.guard.Guard.run``,                     one public call (blocking, or an
             ``_runtime.fatal.Runner.run`` (abort mode)        engine's run of a request): kind,
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
user, codec  (:func:`collectives.timeline.record`)             the program's own phases (the SGD
                                                               driver's and the PyTorch trainer's
                                                               compute, step, update; the
                                                               driver's codec methods)
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
    def run(self, name, fn, *args, **kwargs):  # (keywords passed through as they come)
        rec = ACTIVE
        if rec is None:
            return plain(self, name, fn, *args, **kwargs)
        t0 = clock()
        try:
            result = plain(self, name, fn, *args, **kwargs)
        except BaseException as exc:
            rec.add("call", name, t0, clock(), (self.seq, None, type(exc).__name__,
                                                 *_summary(kwargs.get("call") or args)))
            raise
        # the call: the engine's (``call=``), the checked call a blocking entry point returns,
        # or the arguments of a repeated call or a plan (``src, dst, op, fn, ...``)
        what = kwargs.get("call") or (result if hasattr(result, "kind") else args)
        rec.add("call", name, t0, clock(), (self.seq, None, None, *_summary(what)))
        return result
    return run


def _guard_complete(plain: Callable) -> Callable:
    def complete(self, reqs, expect, peers, *more, **kwargs):
        rec = ACTIVE
        if rec is None:
            return plain(self, reqs, expect, peers, *more, **kwargs)
        native = more[0] if more else kwargs.get("native", False)
        t0 = clock()
        try:
            return plain(self, reqs, expect, peers, *more, **kwargs)
        finally:
            # named at write time (send, recv, sendrecv: .chrome) unless native
            # tuples of numbers: the collector stops tracking them (lists would stay tracked,
            # and every full collection would walk the whole timeline)
            rec.add("message", "native" if native else "", t0, clock(),
                    (tuple(peers), tuple(expect)))
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
                    (self.seq, self.name, None if error is None else type(error).__name__,
                     *_summary(self.call)))
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
            rec.add("shm", modes.get(mode, "shm"), t0, clock(), (x.nbytes, self.comm.size))
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


_NOTHING = (None, None, None, None, None)


def _summary(what: Any) -> tuple:
    """What a call span records of the call (made a dict by :func:`describe` at write time):
    ``(count, dtype, bytes, algorithm name, compressed signature)``, from a checked call object
    (``AllreduceCall`` ...) or the arguments of a repeated call (``src, dst, op, fn, ...``).
    Holds only values the garbage collector does not track (no arrays, no functions), so that
    a long timeline costs its full collections nothing."""
    if type(what) is tuple:  # a repeated allreduce: run_allreduce's arguments
        if len(what) > 3 and hasattr(what[0], "nbytes"):
            src = what[0]
            return src.size, src.dtype, src.nbytes, _names().get(what[3]), None
        return _NOTHING
    if what is None:
        return _NOTHING
    layout = _LAYOUTS.get(type(what))
    if layout is None:
        layout = _LAYOUTS[type(what)] = _layout(type(what))
    src_attr, compressed, fn = layout
    try:
        src = getattr(what, src_attr)
        size, dtype, nbytes = src.size, src.dtype, src.nbytes
    except (AttributeError, TypeError):  # no array (yet), or no layout (src_attr None)
        return _NOTHING
    if compressed:  # the key names the tensor
        key = what.key
        return size, dtype, nbytes, what.algorithm, \
            what.sig if key is None else {**what.sig, "key": str(key)}
    algorithm = ((_NAMES or _names()).get(what.fn) if fn else None) or \
        getattr(what, "algorithm", None)
    return size, dtype, nbytes, algorithm, None


def describe(seq: int, name: str | None, error: str | None, count: int | None, dtype: Any,
             nbytes: int | None, algorithm: str | None, sig: dict | None) -> dict[str, Any]:
    """The ``args`` of a call or request span, from what the wrapper recorded (``seq``, the
    request's ``name``, the ``error``'s type and :func:`_summary`)."""
    info: dict[str, Any] = {}
    if name is not None:
        info["name"] = name
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


#: call class -> (attribute of its array, compressed, has ``fn``): read once per class, so that
#: describing a call raises and catches no AttributeError
_LAYOUTS: dict[type, tuple[str | None, bool, bool]] = {}


def _layout(cls: type) -> tuple[str | None, bool, bool]:
    if "__getattr__" in vars(cls):  # a wrapper (nonblocking._OnDevice): ask the instance
        return "src", False, False
    names: set[str] = set()
    for c in cls.__mro__:
        names.update(getattr(c, "__slots__", ()))
        names.update(vars(c))
    src = "src" if "src" in names else ("buf" if "buf" in names else None)
    return src, "sig" in names, "fn" in names


# -- installing ------------------------------------------------------------------------------------
def _points() -> list[tuple[Any, str, Callable[[Callable], Callable]]]:
    from .. import nonblocking
    from .._runtime.fatal import Runner
    from .._runtime.guard import Guard
    from .._runtime.shmem.team import Team
    from ..compressed.api import TensorCoding  # (defined in compressed._coding)
    from ..engine import requests
    from ..ops import Op

    return [(Guard, "run", _guard_run), (Runner, "run", _guard_run),  # abort mode's runner too
            (Guard, "complete", _guard_complete),
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
