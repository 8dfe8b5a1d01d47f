"""An unhandled exception on any rank ends the whole job, with one traceback.

``import collectives`` installs :func:`install`'s hooks (``sys.excepthook`` and
``threading.excepthook``), whatever launched the script (``mpiexec -n 4 python train.py``, as
Horovod and DDP users start it, not only ``python -m mpi4py``). An exception that reaches the top
of any thread of a rank of a job of several ranks:

- is dumped by the flight recorder (:mod:`collectives.flight_recorder`), printed, then ends every
  rank with ``MPI_Abort`` (exit status 1), as ``python -m mpi4py``
  does: the other ranks would otherwise wait forever in their next collective. A bad argument
  that a call's checks found before it sent anything (:func:`.guard.argument_error`, on this
  rank or on the rank whose notice this is) asks for a dump of reason "argument error", which
  the flight recorder writes only when asked to (its traceback says all a dump would);
- is printed in full once: by the rank whose error it is. An error that every rank raises
  because of another rank (a notice: ``"allreduce #5 failed on rank 2: ..."``) is one line on
  the others, which leave the originating rank a moment (:data:`GRACE_S`) to print its traceback
  and end the job itself; an error every rank reached together (the verdict of
  ``validate=True``) is printed in full by rank 0 and in one line by the others. When several
  ranks fail in one call on their own (both ends of a message of the wrong size), the lowest of
  them prints in full and the others, once its notice arrives (within :data:`PEER_WAIT_S`), one
  line naming it.

Each rank writes what it prints in one ``write`` (:func:`.cli.say`: the traceback with the line
that ends the job, or the one line), so that the launcher, which forwards every rank's output as
it reads it, never runs two ranks' lines together; another rank's whole line may still land
between two lines of a traceback.

``COLLECTIVES_ABORT_ON_ERROR=0`` leaves Python's own hooks alone (for code that manages failures
itself); a job of one rank, and a process whose MPI is finalized, keep them too.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

from . import flight
from .cli import abort_world, say
from .guard import RaisedEverywhere, argument_error

__all__ = ["install", "ENV", "GRACE_S", "PEER_WAIT_S"]

#: Set to 0 to keep Python's own hooks (no MPI_Abort on an unhandled exception).
ENV = "COLLECTIVES_ABORT_ON_ERROR"
#: Seconds a rank whose error came from another rank waits for that rank to end the job.
GRACE_S = 2.0
#: Seconds a rank that failed on its own listens for a lower rank's failure in the same call.
PEER_WAIT_S = 0.5
_INSTALLED = [False]


def install() -> None:
    """Install the hooks (once; not when :data:`ENV` is ``0``)."""
    if _INSTALLED[0] or os.environ.get(ENV, "1").strip().lower() in ("0", "off", "no", "false"):
        return
    _INSTALLED[0] = True
    previous, previous_thread = sys.excepthook, threading.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        text = None
        if previous is sys.__excepthook__:  # Python's own: the same text, in one write
            text = lambda: "".join(traceback.format_exception(kind, exc, tb))  # noqa: E731
        _end_job(exc, lambda: previous(kind, exc, tb), text)

    def thread_excepthook(args: Any) -> None:
        if args.exc_type is SystemExit:
            previous_thread(args)
            return
        name = getattr(args.thread, "name", None)
        text = None
        if previous_thread is threading.__excepthook__:
            text = lambda: f"Exception in thread {name}:\n" + "".join(  # noqa: E731
                traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        _end_job(args.exc_value, lambda: previous_thread(args), text, name)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook


def _world() -> tuple[Any, int, int]:
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return None, 0, 1
    return MPI.COMM_WORLD, MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size


def _end_job(exc: BaseException | None, print_in_full: Callable[[], None],
             text: Callable[[], str] | None, thread: str | None = None) -> None:
    """Dump, print (``text()``: the traceback as Python's own hook prints it, None where a hook
    of the user's prints it: ``print_in_full()``) and end the job (module docstring)."""
    world, rank, size = _world()
    if size == 1 or exc is None:
        print_in_full()
        return
    # -- flight recorder: this rank's last calls, to a file (an argument error: if asked)
    flight.auto_dump("argument error" if argument_error(exc) else "crash", exc)
    where = f"rank {rank}" + (f", thread {thread}" if thread else "")
    origin = getattr(exc, "origin", None) if isinstance(exc, RaisedEverywhere) else rank
    call = getattr(exc, "collectives_call", None)
    if origin == rank and call is not None:  # did a lower rank fail in the same call too?
        origin = call[0].first_reporter(call[1], PEER_WAIT_S)
        origin = rank if origin is None else origin
    if origin == rank or (origin is None and rank == 0):
        line = (f"collectives: {where}: unhandled {type(exc).__name__}: ending the job "
                f"(MPI_Abort; {ENV}=0 to keep it running)\n")
        if text is not None:
            say(text() + line)
        else:
            print_in_full()
            say(line)
    else:
        message = " ".join(str(exc).split())
        also = f" (rank {origin} failed in this call too and prints it in full)" \
            if not isinstance(exc, RaisedEverywhere) else ""
        say(f"collectives: {where}: {type(exc).__name__}: {message}{also}\n")
        if origin is not None:  # the rank whose error this is prints it and ends the job
            time.sleep(GRACE_S)
    abort_world(1)
