"""Command lines of programs that run on every rank: say things once, never hang on an error.

Every rank of an MPI job parses the same arguments, so a plain ``argparse`` prints ``--help`` and
each error p times, each error with its usage block. :class:`Parser` prints help and usage on rank
0 only and turns every error into a :class:`UsageError`; :func:`usage_errors` catches one, prints
``PROG: error: MESSAGE`` once (on rank 0, or on every rank for an error that is not the same
everywhere) and exits every rank with status 2, the exit status of an argparse error.

Any other exception is seen by one rank only, as a rule, and the others would wait for it
forever in their next message. :func:`program` turns a ``main`` into the entry point of a process
(console script, ``python -m``, ``if __name__ == "__main__"``): a usage error as above, any other
unhandled exception (``KeyboardInterrupt`` too) as one line ``PROG: error: rank R: TYPE: MESSAGE``
on the failing rank, then ``MPI_Abort`` on ``COMM_WORLD``, which ends every rank of the job: what
``python -m mpi4py`` does for any script. ``COLLECTIVES_TRACEBACK=1`` prints the traceback too.
``SystemExit`` passes: a program that exits does so on every rank.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from contextlib import contextmanager
from typing import Callable, Iterator, NoReturn

__all__ = ["UsageError", "Parser", "usage_errors", "fatal_errors", "program", "abort",
           "abort_world", "world_rank", "say", "PLOT_INSTALL", "TRACEBACK_ENV"]

#: Set to 1 to print the traceback of an error that ends the job (:func:`abort`), not just its line.
TRACEBACK_ENV = "COLLECTIVES_TRACEBACK"
#: Seconds between the error line and MPI_Abort (the launcher's forwarder reads the line).
ABORT_DELAY_S = 0.2

#: How to get matplotlib, for the programs that draw (``--plot``, ``collectives-plot``).
PLOT_INSTALL = "pip install 'mpi-collectives[plot]' (from a clone: pip install -e '.[plot]')"


class UsageError(Exception):
    """A bad command line: one line of text, exit status 2.

    ``uniform`` says whether every rank reaches the same verdict (they parse the same arguments and
    run the same checks); then only rank 0 prints it.
    """

    def __init__(self, message: str, *, uniform: bool = True) -> None:
        super().__init__(message)
        self.uniform = uniform


def say(text: str) -> None:
    """Write ``text`` (whole lines) to standard error in one ``write``: the launcher forwards
    each rank's output as it reads it, and a line written in pieces (``print`` writes the text
    and its newline apart) can have another rank's output land in its middle. Where standard
    error is no file (replaced by a test's capture), its own ``write``."""
    text = text if text.endswith("\n") else text + "\n"
    stream = sys.stderr
    try:
        stream.flush()
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # no file descriptor: a capture
        stream.write(text)
        stream.flush()
        return
    data = text.encode("utf-8", "replace")
    while data:  # one write, unless the pipe takes only part of it
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:  # closed: nothing more to say on it
            return


def world_rank() -> int:
    """This process's rank in ``COMM_WORLD`` (0 without MPI)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.rank if MPI.Is_initialized() else 0


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` for a program every rank runs (see the module docstring).

    ``rank`` is this process's rank (default: its rank in ``COMM_WORLD``); only rank 0 prints.
    """

    def __init__(self, *args, rank: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rank = world_rank() if rank is None else rank

    def error(self, message: str):  # one line, raised, instead of usage + message + exit
        raise UsageError(message)

    def _print_message(self, message: str, file=None) -> None:  # help, usage, version
        if self.rank == 0:
            super()._print_message(message, file)


@contextmanager
def usage_errors(prog: str, rank: int | None = None) -> Iterator[None]:
    """Run the body; on :class:`UsageError` print it once and exit with status 2."""
    try:
        yield
    except UsageError as exc:
        if (world_rank() if rank is None else rank) == 0 or not exc.uniform:
            print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def abort_world(status: int = 1, delay: float = ABORT_DELAY_S) -> NoReturn:
    """``MPI_Abort`` on ``COMM_WORLD`` after ``delay`` seconds, and never return to the caller.

    The launcher forwards a rank's output through a pipe; an abort at once can end its forwarder
    before it has read what this rank printed last: the delay gives it a moment.

    MPI_Abort need not return, and MPICH's (the PyPI wheel, under Hydra) may: it asks the launcher
    to end the job and goes on until the launcher's signal arrives. Code after it would run in
    that window (a caught error's rank could enter its next collective and match the others'
    pending call), so this process exits at once after the request (``os._exit``: no cleanup can
    block); a nonzero exit ends the job under every launcher.

    The names of the MPI library's shared-memory files this process maps are removed first:
    ``MPI_Abort`` leaves them in ``/dev/shm`` (``mpi_shm_files.py``)."""
    from mpi4py import MPI

    from .mpi_shm_files import unlink_mapped

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing more to say on it
            pass
    time.sleep(delay)
    unlink_mapped()
    MPI.COMM_WORLD.Abort(status)
    os._exit(status or 1)


def abort(prog: str, exc: BaseException, status: int = 1) -> NoReturn:
    """End the whole job for ``exc``, raised on this rank: one line, then ``MPI_Abort``.

    The line is ``PROG: error: rank R: TYPE: MESSAGE`` on standard error (the traceback before it
    with ``COLLECTIVES_TRACEBACK=1``). Without MPI, or alone in ``COMM_WORLD``, the process
    just exits with ``status``.
    """
    from mpi4py import MPI

    live = MPI.Is_initialized() and not MPI.Is_finalized()
    rank, size = (MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size) if live else (0, 1)
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        traceback.print_exception(exc)
    text = " ".join(str(exc).split())  # one line, whatever the message holds
    print(f"{prog}: error: rank {rank}: {type(exc).__name__}" + (f": {text}" if text else ""),
          file=sys.stderr, flush=True)
    if size > 1:
        abort_world(status)
    raise SystemExit(status)


@contextmanager
def fatal_errors(prog: str, rank: int | None = None) -> Iterator[None]:
    """Run the body of a process's program: :func:`usage_errors`, and :func:`abort` for any other
    exception but ``SystemExit``."""
    try:
        with usage_errors(prog, rank):
            yield
    except SystemExit:
        raise
    except BaseException as exc:  # KeyboardInterrupt too: a rank that stops must stop them all
        abort(prog, exc)


def program(prog: str, main: Callable[[], int | None]) -> Callable[[], int]:
    """The entry point of a process that runs ``main()``: its exit status (an int that ``main``
    returns, else 0), under :func:`fatal_errors`. Console scripts name it; ``python -m`` and
    ``__main__`` blocks call ``sys.exit(program(PROG, main)())``. ``main`` itself stays callable
    in-process (tests), where exceptions propagate as usual."""

    def script() -> int:
        with fatal_errors(prog):
            status = main()
        return status if isinstance(status, int) else 0

    script.__doc__ = f"Console script ``{prog}``: ``main()`` under fatal_errors (one line, then MPI_Abort)."
    return script
