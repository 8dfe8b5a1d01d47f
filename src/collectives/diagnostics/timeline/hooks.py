"""Where the timeline's spans come from: observers of the library's observation points.

The library calls the observers registered on its observation points (``observe.py``)
where things happen: a call's end, a message round, a pass through a shared window ... .
:func:`install` registers the observers below on those points (once) and :func:`uninstall`
unregisters them, so that with no timeline each point costs the library one test of an empty
tuple, and no function of the library is ever replaced. Each observer reads :data:`ACTIVE`
once and appends one span to the calling thread's lane (:mod:`.recorder`); the point gives it
the times it measured. The observers, by span category:

===========  =================================================  =================================
category     observation point (where)                          span
===========  =================================================  =================================
call         ``call`` (``_runtime.guard.Guard.run``, abort       one public call (blocking, or an
             mode's ``_runtime.abort_mode.Runner.run``, at the end)  engine's run of a request): kind,
                                                                seq, count, dtype, bytes,
                                                                algorithm, strategy, codec
submit       ``submit`` (``nonblocking._submit``)               ``iallreduce(...)`` and the
                                                                others up to their return
                                                                (checks, queueing)
request      ``request`` (``engine.requests.Request.complete``) the engine's run of a request
                                                                (``started`` to ``finished``),
                                                                on the thread that ran it: kind,
                                                                name (``name=``, the buckets of
                                                                ``DistributedOptimizer``), seq
wait         ``wait`` (``engine.requests.wait_for``)            a ``wait()``/``waitall()`` that
                                                                blocks
message      ``message`` (``_runtime.guard.Guard.complete``)    each exchange round inside a
                                                                call: its messages' wait (send,
                                                                recv, sendrecv; "native": an MPI
                                                                collective), peers and bytes
pt2pt        ``pt2pt`` (``pt2pt.messages``: ``send``, ``recv``,   one public point-to-point
             ``sendrecv``, ``isend``/``irecv`` to their end)    message (a ``sendrecv``: one per
                                                                half), named by its call: side,
                                                                peer, tag, bytes, dtype, error
shm          ``shm`` (``_runtime.shmem.team.Team.run``, which     one pass through the node's
             a repeated call's lane takes while observed)       shared window, by mode
encode,      ``codec`` (``compressed.coding.TensorCoding``'s     a codec's work inside a
decode,      ``encode``, ``decode``, ``aggregate_into``)         compressed allreduce
aggregate
reduce       ``reduce`` (``ops.Op.combine``)                    a local reduction (a block of a
                                                                round)
user, codec  (:func:`collectives.timeline.record`)              the program's own phases (the
                                                                SGD driver's and the PyTorch
                                                                trainer's compute, step, update;
                                                                the driver's codec methods)
===========  =================================================  =================================
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ... import observe
from .recorder import Recorder

__all__ = ["ACTIVE", "OBSERVERS", "install", "uninstall"]

#: The recorder in use, or None: what every observer reads first.
ACTIVE: Recorder | None = None


# -- the observers ---------------------------------------------------------------------------------
def _events(rec: Recorder) -> list:
    """The calling thread's list of spans in ``rec`` (its lane's, made at its first span)."""
    try:
        return rec.local.events
    except AttributeError:
        return rec.lane().events


def _call(name: str, t0: float, t1: float, seq: int, what: tuple | None, call: Any,
          error: str | None) -> None:
    """A call's span, at its end: its times, number, the flight recorder's description of it
    (``what``, or None) and its error's type. Compressed calls are read here instead
    (:func:`_summary`: codec, strategy and step, which the description does not hold)."""
    rec = ACTIVE
    if rec is None:
        return
    if what is None or name in _SIGNED:
        what = _summary(call)
    if error is not None:
        what = (None, error, what)
    _events(rec).append(("call", name, t0, t1, what, seq))


#: call kinds whose span needs what the flight record does not hold (codec, strategy, step)
_SIGNED = frozenset({"compressed_allreduce", "compressed_reduce_scatter", "compressed_allgather"})


def _message(native: bool, peers: list[int], expect: list[int | None], t0: float,
             t1: float) -> None:
    rec = ACTIVE
    if rec is None:
        return
    # named at write time (send, recv, sendrecv: .chrome) unless native; the peers, then what
    # each expected, in one tuple of numbers (which the collector stops tracking, where lists
    # would stay tracked and every full collection would walk them)
    _events(rec).append(("message", "native" if native else "", t0, t1, (*peers, *expect),
                         None))


def _pt2pt(kind: str, op: Any, t0: float, t1: float | None, error: str | None) -> None:
    """A point-to-point message's span, at its end (its start is not a span)."""
    rec = ACTIVE
    if rec is None or t1 is None:
        return
    info = {"side": op.side, "peer": op.peer, "tag": op.tag, "bytes": op.nbytes,
            "dtype": op.dtype}
    if error is not None:
        info["error"] = error
    rec.add("pt2pt", kind, t0, t1, info)


def _submit(kind: str, name: str | None, t0: float, t1: float) -> None:
    rec = ACTIVE
    if rec is not None:
        rec.add("submit", kind, t0, t1, None if name is None else {"name": name})


def _request(request: Any, error: BaseException | None) -> None:
    rec = ACTIVE
    if rec is not None and request.started is not None and request.finished is not None:
        rec.add("request", request.kind, request.started, request.finished,
                (request.name, None if error is None else type(error).__name__,
                 _summary(request.call)), request.seq)


def _wait(requests: Sequence[Any], t0: float, t1: float) -> None:
    rec = ACTIVE
    if rec is not None:
        names = [r.name if r.name is not None else f"{r.kind} #{r.seq}" for r in requests]
        rec.add("wait", "wait", t0, t1, {"requests": tuple(names)})


_SHM_MODES: dict[int, str] = {}  # shmem.layout's modes -> span names


def _shm(comm: Any, mode: int, nbytes: int, t0: float, t1: float) -> None:
    rec = ACTIVE
    if rec is None:
        return
    if not _SHM_MODES:
        from ..._runtime.shmem import layout

        _SHM_MODES.update({layout.FUSED: "shm allreduce",
                           layout.REPLICATED: "shm allreduce (replicated)",
                           layout.REDUCE_SCATTER: "shm reduce-scatter",
                           layout.ALLGATHER: "shm allgather",
                           layout.ALLTOALL: "shm alltoall",
                           layout.ALLTOALL_CMA: "shm alltoall (cross-memory attach)"})
    rec.add("shm", _SHM_MODES.get(mode, "shm"), t0, t1, (nbytes, comm.size))


def _codec(phase: str, t0: float, t1: float) -> None:
    rec = ACTIVE
    if rec is not None:
        rec.add(phase, phase, t0, t1, None)


def _reduce(op: str, nbytes: int, t0: float, t1: float) -> None:
    rec = ACTIVE
    if rec is not None:
        _events(rec).append(("reduce", "reduce", t0, t1, (op, nbytes), None))


#: The timeline's observer of each observation point (``observe.py``).
OBSERVERS: dict[str, Callable[..., None]] = {
    "call": _call, "submit": _submit, "request": _request, "wait": _wait,
    "message": _message, "pt2pt": _pt2pt, "shm": _shm, "codec": _codec, "reduce": _reduce,
}


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
_registered = False  # whether OBSERVERS are registered


def install(recorder: Recorder) -> None:
    """Record into ``recorder`` from now on (registers the observers, once)."""
    global ACTIVE, _registered
    ACTIVE = recorder
    if not _registered:
        for point, observer in OBSERVERS.items():
            observe.register(point, observer)
        _registered = True


def uninstall() -> None:
    """Stop recording and unregister the observers."""
    global ACTIVE, _registered
    ACTIVE = None
    if _registered:
        for point, observer in OBSERVERS.items():
            observe.unregister(point, observer)
        _registered = False
