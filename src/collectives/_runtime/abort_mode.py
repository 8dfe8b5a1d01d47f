"""``Options.on_error = "abort"``: blocking MPI on the hot path; an error or a timeout ends the job.

The default mode (``"raise"``, :mod:`.guard`) turns an error on one rank into an error on every
rank and leaves the job running: every wait also watches for a notice, and MPI's own collectives
run as non-blocking ones with a landing buffer. That costs a few microseconds a call, which is
most of a small message's time. Horovod and PyTorch DDP make the other choice, and so does this
mode: a public call runs its algorithm outside the guard, as plain blocking MPI calls (the
algorithms' ``guard is None`` branches, the ones a direct call of an algorithm takes), and

- an exception raised on this rank inside the call (a bad argument only it sees, a size mismatch
  that MPI reports, an error in a codec) prints this rank's traceback and one line naming the call,
  then ends the whole job with ``MPI_Abort``: the other ranks, blocked in MPI, could not be told;
- a call that runs longer than ``Options.timeout`` is ended the same way by a watchdog thread
  (PyTorch's NCCL watchdog does this): it prints which call on which rank, then ``MPI_Abort``.
  The thread starts with the first call that has a timeout, wakes every quarter of the timeout
  (at most every second), and costs the hot path two attribute stores.

Calls are numbered as in the default mode (the guard's counter), so the numbers in messages agree
with the other mode's. Every rank must use the same mode for the same call, as for any option.
Non-blocking operations (the engine) keep the default semantics. Chosen per call through
``Options`` or ``COLLECTIVES_ON_ERROR``; when to use which: docs/reliability.md.
"""

from __future__ import annotations

import threading
import time
import traceback
import weakref
from typing import Any, Callable

from ..options import Options
from . import flight
from .cli import abort_world, say
from .guard import argument_error
from ..observe import OBSERVERS as _OBSERVED
from .context import Context

__all__ = ["Runner", "runner", "MODES"]

# module globals read by every call (cheaper than the module's attributes)
_clock = flight.clock
_STARTED, _FINISHED = flight.STARTED, flight.FINISHED

#: the values of ``Options.on_error``
MODES = ("raise", "abort")


class Runner:
    """Runs the public calls of one context in abort mode (the counterpart of ``Guard.run``)."""

    __slots__ = ("ctx", "guard", "name", "seq", "since", "timeout", "call", "__weakref__")

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.guard: Any = None  # ctx.guard, taken at the first call
        self.name = ""
        self.seq = 0
        self.since: float | None = None  # time.monotonic() the running call started, if timed
        self.timeout = 0.0
        self.call: Any = None  # the running call's checked arguments (as Guard.call)

    def set_timeout(self, timeout: float | None) -> None:
        """Let the watchdog end the job once the running call has taken ``timeout`` seconds."""
        if timeout is not None:
            self.timeout = timeout
            self.since = time.monotonic()
            _watch(self)

    def run(self, name: str, fn: Callable[..., Any], *args: Any,
            timeout: float | None = None, call: Any = None, what: tuple | None = None) -> Any:
        """``fn(*args)`` with blocking MPI calls; any exception ends the job (module docstring).
        The call goes into the guard's flight recorder as ``Guard.run`` records it (``what``:
        its description, if the caller made one)."""
        guard = self.guard
        if guard is None:  # the first call: the context makes its guard (collectively)
            guard = self.guard = self.ctx.guard
        seq = guard.seq = guard.seq + 1
        self.name, self.seq = name, seq
        if timeout is not None:
            self.set_timeout(timeout)
        records = guard.records  # -- flight recorder (collectives._runtime.flight)
        if records is not None:
            rec = records[seq % guard.nrecords]
            rec.seq, rec.kind, rec.what, rec.state = seq, name, what, _STARTED
        observers = _OBSERVED.call  # -- observers (observe.py: the timeline): off, this test only
        t0 = _clock() if observers else 0.0
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - every error ends the job in this mode
            if records is not None or observers:
                flight.failed(rec if records is not None else None, exc, what, self.call,
                              observers, name, t0, seq)
            _end(f"{name} #{seq} failed on this rank{_truncated(exc, self.call)}", exc)
        finally:
            self.since = None
            call, self.call = self.call, None  # the call's arrays are the caller's again
        if records is not None:  # -- flight recorder: the record's end
            rec.state, rec.t1 = _FINISHED, _clock()
            if what is None and call is not None:
                rec.what = flight.describe(call)
        if observers:  # -- observers
            flight.tell_finished(rec if records is not None else None, what, call, observers,
                                 name, t0, seq)
        return result


def runner(ctx: Context, options: Options) -> Any:
    """What runs a blocking public call on ``ctx`` under ``options`` (resolved already:
    ``validate.resolve``): the communicator's guard (``on_error="raise"``) or the context's
    :class:`Runner` (``"abort"``, made on first use). Both have ``run``, ``set_timeout`` and
    ``call``."""
    if options.on_error == "raise":
        return ctx.guard
    r = ctx.cache.get(Runner)
    if r is None:
        r = ctx.cache[Runner] = Runner(ctx)
    return r


def _truncated(exc: BaseException, call: Any) -> str:
    """What a message longer than its receive (MPI_ERR_TRUNCATE) means, naming this rank's array."""
    from mpi4py import MPI

    if not isinstance(exc, MPI.Exception) or exc.Get_error_class() != MPI.ERR_TRUNCATE:
        return ""
    src = getattr(call, "src", None)
    mine = "" if src is None else f" (this rank: {src.size} elements of {src.dtype})"
    return f": count or dtype differs across ranks{mine}, MPI says"


def _end(what: str, exc: BaseException | None) -> None:
    """Print this rank's error and one line, then end the job (``MPI_Abort``)."""
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.rank if MPI.Is_initialized() and not MPI.Is_finalized() else 0
    reason = "timeout" if exc is None else "argument error" if argument_error(exc) else "crash"
    flight.auto_dump(reason, exc)  # -- flight recorder (an argument error: if asked)
    text = f": {type(exc).__name__}: {' '.join(str(exc).split())}" if exc is not None else ""
    # the traceback and the line in one write (cli.say): no other rank's line in between
    say("".join(traceback.format_exception(exc) if exc is not None else ())
        + f"collectives: rank {rank}: {what}{text}: ending the job (MPI_Abort; "
        "Options.on_error='abort', 'raise' keeps it running: docs/reliability.md)\n")
    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.size > 1:
        abort_world(1)
    if exc is not None:
        raise exc
    raise SystemExit(1)


# -- the watchdog ---------------------------------------------------------------------------------
_WATCHED: "weakref.WeakSet[Runner]" = weakref.WeakSet()
_THREAD: list[threading.Thread | None] = [None]
_LOCK = threading.Lock()


def _watch(r: Runner) -> None:
    if r in _WATCHED and _THREAD[0] is not None:
        return
    with _LOCK:
        _WATCHED.add(r)
        if _THREAD[0] is None:
            _THREAD[0] = threading.Thread(target=_watchdog, name="collectives-watchdog",
                                          daemon=True)
            _THREAD[0].start()


def _watchdog() -> None:
    while True:
        runners = list(_WATCHED)
        period = min([r.timeout / 4 for r in runners] + [1.0])
        time.sleep(max(period, 0.01))
        now = time.monotonic()
        for r in runners:
            since = r.since
            if since is not None and now - since > r.timeout:
                _end(f"{r.name} #{r.seq} timed out after {r.timeout:g} s (Options.timeout): a "
                     "rank has not made the call, or is stuck in an earlier one", None)
