"""Where engines come from and how they end.

- :func:`engine_of` gives a communicator's engine, creating it at the first non-blocking call,
  which is therefore collective: it returns once every rank has made its first non-blocking
  call on the communicator (the engine duplicates it). The engine hangs off the communicator in
  the library's one MPI attribute there, beside the blocking functions' private duplicate
  (:mod:`collectives._runtime.comm_state`), so freeing the communicator shuts it down first.
- The MPI library must provide ``MPI_THREAD_MULTIPLE``: the engine's thread calls MPI while the
  caller's threads do. :func:`require_threads` says so clearly at the first non-blocking call
  when it does not (mpi4py asks for it unless ``mpi4py.rc.thread_level`` says otherwise; MPICH and
  Open MPI both provide it).
- **Shutdown.** At interpreter exit (``atexit``, which runs before mpi4py finalizes MPI) and on an
  explicit ``MPI.Finalize()``, every engine stops accepting work and waits for what is queued:
  up to the largest ``Options.timeout`` of its requests, else :data:`EXIT_GRACE_S`. Operations
  that still cannot finish (a rank never submitted them) are reported on stderr, with the ranks
  that have not submitted them, and the job is aborted (``MPI_Abort``): a hang at exit is never
  the outcome, nor a crash inside ``MPI_Finalize`` with a thread still in MPI.

  ``MPI_Finalize`` must not start while an engine's thread is inside MPI: MPICH holds its global
  lock from the start of ``MPI_Finalize``, through the delete callbacks of ``MPI_COMM_SELF``'s
  attributes (MPI's own finalize hook), so a thread still in MPI then can neither finish nor be
  waited for (it hangs, or MPICH aborts destroying a mutex in use). So ``mpi4py.MPI.Finalize``
  is wrapped to shut the engines down first. A hook run from the deletion of
  ``MPI_COMM_SELF``'s attribute (:func:`collectives._runtime.comm_state.at_finalize`) stays as the
  safety net for code that kept the unwrapped function: there, nothing can be waited for, so
  idle engines are stopped without further MPI calls and busy ones are reported, then the job
  is aborted.
"""

from __future__ import annotations

import atexit
import sys
import threading
import warnings

from mpi4py import MPI

from .._runtime import comm_state
from .._runtime.cli import abort_world
from .._runtime.release import mark_exiting
from .engine import Engine

__all__ = ["engine_of", "require_threads", "live_engines", "shutdown", "EXIT_GRACE_S"]

#: How long exit waits for queued operations when no ``Options.timeout`` says otherwise.
EXIT_GRACE_S = 60.0

_LEVELS = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
           MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
           MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}
_CREATE = threading.Lock()
_LIVE: dict[int, Engine] = {}
_state = {"threads_ok": False, "shut": False}


def require_threads() -> None:
    """Raise ``RuntimeError`` unless MPI was initialised with ``MPI_THREAD_MULTIPLE``."""
    if _state["threads_ok"]:
        return
    level = MPI.Query_thread()
    if level < MPI.THREAD_MULTIPLE:
        raise RuntimeError(
            "non-blocking collectives need MPI_THREAD_MULTIPLE (their progress thread calls MPI "
            f"while yours do), but MPI was initialised with {_LEVELS.get(level, level)}. mpi4py "
            "asks for MPI_THREAD_MULTIPLE unless told otherwise: remove the "
            "mpi4py.rc.thread_level setting (or set it to 'multiple') before importing "
            "mpi4py.MPI, and use an MPI library built with thread support (MPICH and Open MPI "
            "are). The blocking functions work at any thread level.")
    _state["threads_ok"] = True


def _free(comm: MPI.Comm, engine: Engine) -> None:
    """The communicator is being freed: finish its operations, then free the engine's."""
    _LIVE.pop(id(engine), None)
    if engine.drain(_grace(engine)):
        engine.stop()
    else:
        warnings.warn(f"{engine.label} freed with operations that cannot complete: "
                      + "; ".join(_stuck(engine)), RuntimeWarning, stacklevel=2)
        _LIVE[id(engine)] = engine  # exit will deal with it


comm_state.register("engine", _free)


def engine_of(comm: MPI.Intracomm, timeout: float | None = None) -> Engine:
    """The progress engine of ``comm``, created at the first call (thread-safe; the creation is
    collective: it waits up to ``timeout`` for every rank's first call)."""
    engine = comm_state.get(comm, "engine")
    if engine is None:
        require_threads()
        with _CREATE:  # held while initiating, not while waiting for the other ranks
            engine = comm_state.get(comm, "engine")
            created = engine is None
            if created:
                if _state["shut"]:
                    raise RuntimeError("collectives: MPI is finalizing; no new non-blocking "
                                       "operations")
                engine = Engine(comm)
                comm_state.put(comm, "engine", engine)
                _LIVE[id(engine)] = engine
        if created:
            engine.complete_setup(timeout)
    if not engine.setup_done.is_set() or engine.setup_error is not None:
        engine.wait_setup(timeout)
    return engine


def live_engines() -> list[Engine]:
    """Every engine not yet shut down (tests count them: none may leak)."""
    return list(_LIVE.values())


def _grace(engine: Engine) -> float:
    timeouts = [r.opts.timeout for r in engine.outstanding() if r.opts.timeout is not None]
    return max(timeouts) if timeouts else EXIT_GRACE_S


def _stuck(engine: Engine) -> list[str]:
    pending = [r for r in engine.outstanding() if not r.test()]
    return [engine.report(r) for r in pending[:8]] or [f"{engine.pending} operation(s)"]


def shutdown(abort: bool = True) -> None:
    """Drain and stop every engine; report and ``MPI_Abort`` if some cannot finish.

    Runs at interpreter exit and before ``MPI.Finalize``; call it yourself to end the engines'
    threads early (a later non-blocking call is an error).
    """
    if _state["shut"] or MPI.Is_finalized():
        return
    _state["shut"] = True
    engines = list(_LIVE.values())
    stuck: list[tuple[Engine, list[str]]] = []
    for engine in engines:
        if engine.drain(_grace(engine)):
            engine.stop()
        else:
            stuck.append((engine, _stuck(engine)))
    _LIVE.clear()
    if stuck:
        _report(stuck, "complete at exit", abort)


def _report(stuck: list[tuple[Engine, list[str]]], when: str, abort: bool) -> None:
    lines = [f"collectives: rank {MPI.COMM_WORLD.rank}: non-blocking operations that cannot "
             f"{when}:"]
    for engine, reports in stuck:
        lines += [f"  {line}" for line in reports]
    print("\n".join(lines), file=sys.stderr, flush=True)
    if abort:
        abort_world(1, delay=0.5)  # mpiexec forwards the report before the job ends


def _at_finalize() -> None:
    """Inside ``MPI_Finalize`` (the unwrapped one): stop what can stop, abort if anything is busy."""
    if _state["shut"]:
        return
    _state["shut"] = True
    stuck = []
    for engine in list(_LIVE.values()):
        if engine.pending or not engine.halt():
            stuck.append((engine, [f"{r.describe()} on {engine.label}"
                                   for r in engine.outstanding()[:8]]
                          or [f"the engine of {engine.label} is inside MPI"]))
    _LIVE.clear()
    if stuck:
        _report(stuck, "complete: MPI_Finalize was called with them in flight (call "
                "collectives.waitall first, or MPI.Finalize as wrapped by collectives)", True)


_finalize = MPI.Finalize


def _wrapped_finalize() -> None:
    mark_exiting()
    shutdown()
    _finalize()


_wrapped_finalize.__doc__ = (f"{_finalize.__doc__ or 'MPI_Finalize.'}\n\n(Wrapped by "
                             "collectives: shuts the progress engines down first.)")
MPI.Finalize = _wrapped_finalize
atexit.register(shutdown)
atexit.register(mark_exiting)  # runs first (last registered): engines stopped at exit free
# their communicators at once (_runtime/release.py)
comm_state.at_finalize("engine", _at_finalize)
