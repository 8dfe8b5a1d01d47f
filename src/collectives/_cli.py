"""Command lines of programs that run on every rank: say things once, not once per rank.

Every rank of an MPI job parses the same arguments, so a plain ``argparse`` prints ``--help`` and
each error p times, each error with its usage block. :class:`Parser` prints help and usage on rank
0 only and turns every error into a :class:`UsageError`; :func:`usage_errors` catches one, prints
``PROG: error: MESSAGE`` once (on rank 0, or on every rank for an error that is not the same
everywhere) and exits every rank with status 2, the exit status of an argparse error.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Iterator

__all__ = ["UsageError", "Parser", "usage_errors", "world_rank", "PLOT_INSTALL"]

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
