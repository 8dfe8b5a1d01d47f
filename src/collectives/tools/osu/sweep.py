"""What a benchmark's loop over message sizes shows and keeps, on rank 0.

A sweep of ``--algorithm all`` up to 64 MiB runs for minutes: :class:`Sweep` shows a progress bar
on stderr (tqdm, rank 0 only, one step per size; ``--no-progress`` turns it off), prints each OSU
row on ``out`` without tearing the bar, and rewrites ``--json``/``--csv`` after every size
(atomically, ``"complete": false`` in the JSON until the last size, ``"mpi_library"`` naming the
MPI it ran on), so an interrupted run keeps every size it finished. Every other rank does nothing
here.
"""

from __future__ import annotations

import sys
from typing import Sequence, TextIO

from ..._runtime.mpilib import mpi_library
from .results import Record, write_csv, write_json

__all__ = ["Sweep"]


class Sweep:
    """Rank 0's rows, progress bar and result files for one run (see the module docstring)."""

    def __init__(self, prog: str, args, sizes: Sequence[int], rank: int, out: TextIO,
                 meta: dict) -> None:
        self.args, self.out = args, out
        self.meta = {**meta, "mpi_library": str(mpi_library())}
        self.active = rank == 0
        self.bar = None
        if self.active and getattr(args, "progress", False) and sizes:
            from tqdm import tqdm

            self.bar = tqdm(total=len(sizes), desc=prog, unit="size", file=sys.stderr,
                            leave=False, dynamic_ncols=True, mininterval=0, miniters=1)

    def __enter__(self) -> "Sweep":
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the bar whatever happened: an error's message then starts on a line of its own."""
        if self.bar is not None:
            self.bar.close()

    def print(self, line: str) -> None:
        """Print ``line`` on ``out`` (rank 0), clearing and redrawing the bar around it."""
        if not self.active:
            return
        if self.bar is not None:
            self.bar.write(line, file=self.out)
            self.out.flush()
        else:
            print(line, file=self.out, flush=True)

    def size_done(self, size: int, records: Sequence[Record]) -> None:
        """One size measured: advance the bar and rewrite the result files with ``records``."""
        if not self.active:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(f"{size} B", refresh=False)
            self.bar.update()
        self._write(records, complete=False)

    def finish(self, records: Sequence[Record]) -> None:
        """The run is over: close the bar, write the files a last time (``complete``)."""
        if not self.active:
            return
        if self.bar is not None:
            self.bar.close()
        self._write(records, complete=True)

    def _write(self, records: Sequence[Record], complete: bool) -> None:
        if self.args.json:
            write_json(self.args.json, records, **self.meta, complete=complete)
        if self.args.csv:
            write_csv(self.args.csv, records)
