"""A stage that raises: every other rank of the pipeline raises too, instead of waiting forever.

Point-to-point has no failure guard (docs/pt2pt.md, "Failures"): a rank that waits for an
activation from a stage that raised would wait forever. :class:`Failures` keeps one receive
posted for notices on a private duplicate of the whole mesh's communicator (made once,
collectively), and every wait of the executor tests it beside its own message. A rank whose
stage raises sends a notice (its stage, rank, the action and the error, one short message) to
every other rank, then raises its own error; a rank that finds a notice raises
:class:`PipelineError` naming the stage and its error. :meth:`Failures.barrier` ends every step
(a non-blocking barrier tested beside the notice): no rank leaves a step, to the data-parallel
gradient allreduce or the next step, before every rank has finished it, so a notice always
finds its receivers in a wait that looks for it.

After a failure the duplicate is not freed (a notice may still be on its way to it, and a
communicator made later could reuse its context); a pipeline closed without one frees it.
"""

from __future__ import annotations

import os
import time

from mpi4py import MPI

__all__ = ["Failures", "PipelineError"]

#: the longest notice, in bytes (its text is cut to fit)
NOTICE_BYTES = 1024
#: tests of a wait before it yields the processor between tests
_SPINS = 16
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


class PipelineError(RuntimeError):
    """Another rank's stage raised: its stage, rank and error are in the message."""


class Failures:
    """The notice channel of one pipeline (module docstring). Collective to make."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.rank, self.comm.size
        self._buf = bytearray(NOTICE_BYTES)
        self._status = MPI.Status()
        self._req = self.comm.Irecv([self._buf, MPI.BYTE], MPI.ANY_SOURCE, 0)
        self._sent: list[tuple[MPI.Request, bytes]] = []
        self.failed = False

    def check(self) -> None:
        """Raise :class:`PipelineError` if a notice has come."""
        if self._req.Test(self._status):
            self.failed = True
            n = self._status.Get_count(MPI.BYTE)
            text = bytes(self._buf[:n]).decode("utf-8", "replace")
            raise PipelineError(f"pipeline: {text}")

    def tell(self, text: str) -> None:
        """Send the notice ``text`` to every other rank (non-blocking; small, so MPI sends it
        eagerly)."""
        self.failed = True
        data = text.encode("utf-8", "replace")[:NOTICE_BYTES]
        for r in range(self.size):
            if r != self.rank:
                self._sent.append((self.comm.Isend([data, MPI.BYTE], r, 0), data))

    def wait(self, test, what: str, timeout: float | None = None) -> None:
        """Call ``test()`` until it returns True, checking for notices between calls; with
        ``timeout``, TimeoutError after that many seconds."""
        if test():
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        spins = 0
        while not test():
            self.check()
            spins += 1
            if spins > _SPINS:
                _yield()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"pipeline: timed out after {timeout:g} s waiting for "
                                       f"{what}")

    def barrier(self, timeout: float | None = None) -> None:
        """Wait until every rank has reached this barrier, or raise a notice."""
        req = self.comm.Ibarrier()
        try:
            self.wait(req.Test, "the other ranks to finish the step", timeout)
        except BaseException:
            self.failed = True  # the barrier stays in flight: the duplicate is kept
            raise

    def close(self) -> None:
        """Free the duplicate if no failure happened (module docstring)."""
        if self.failed or self.comm == MPI.COMM_NULL or MPI.Is_finalized():
            return
        self._req.Cancel()
        self._req.Wait()
        self.comm.Free()
        self.comm = MPI.COMM_NULL
