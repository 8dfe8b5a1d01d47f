"""The C backtrace of a rank that crashed, for the failure message of the test it was in.

Python's ``faulthandler`` (on in every rank) prints each thread's Python frames on a segmentation
fault, not the C frames below them: inside an MPI call it cannot say which part of the MPI
library, or which of our compiled kernels, faulted. So where ``gdb`` is installed the ranks of
the multi-rank jobs may leave a core file (:func:`allow_core`, from ``tests/mpi/runner.py``:
``RLIMIT_CORE`` raised to its hard limit), and the outer run (``tests/mpi_launch.py``), when a
job ends while a test was under way, looks for a core written since the job started
(:func:`find_core`: the system's ``core_pattern`` must write a file ``core`` or ``core.<pid>``
in the job's working directory, as Linux does by default; a pattern that pipes cores to a
collector leaves none, and then nothing happens), has ``gdb`` print every thread's backtrace
(:func:`backtrace`), keeps it beside the job's logs, quotes the crashed thread's frames in the
failure message and deletes the core (hundreds of MB with PyTorch loaded).
``COLLECTIVES_TEST_CORES=0`` turns it off.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
from pathlib import Path

__all__ = ["enabled", "allow_core", "find_core", "backtrace", "crashed_thread"]

#: seconds gdb may take to read a core (about 5 s of CPU with PyTorch loaded)
GDB_TIMEOUT_S = 300


def enabled() -> bool:
    """Whether crashed ranks' cores are read: gdb is installed and not turned off."""
    return shutil.which("gdb") is not None and os.environ.get("COLLECTIVES_TEST_CORES") != "0"


def allow_core() -> None:
    """Let this process leave a core file if it crashes (where :func:`enabled`)."""
    if not enabled():
        return
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def find_core(directory: Path, since: float) -> Path | None:
    """The newest core file in ``directory`` written at or after ``since`` (a ``time.time()``),
    or None."""
    found = [p for p in directory.glob("core*") if re.fullmatch(r"core(\.\d+)?", p.name)
             and p.is_file() and p.stat().st_mtime >= since]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def backtrace(core: Path, executable: str, out: Path) -> str | None:
    """Every thread's backtrace in ``core`` of a process of ``executable``, written to ``out``;
    the core is deleted. None if gdb could not read it."""
    try:
        proc = subprocess.run(["gdb", "-batch", "-nx", "-ex", "thread apply all bt 40",
                               executable, str(core)], capture_output=True, text=True,
                              timeout=GDB_TIMEOUT_S, stdin=subprocess.DEVNULL)
        text = proc.stdout + proc.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        text = None
        out.write_text(f"gdb failed on {core}: {e}\n")
    finally:
        core.unlink(missing_ok=True)
    if text is not None:
        out.write_text(text)
    return text


def crashed_thread(text: str, frames: int = 25) -> str:
    """The crashed thread's frames from :func:`backtrace`'s text: gdb names it as the current
    thread (``[Current thread is N ...]``) and lists it under ``Thread N``."""
    current = re.search(r"\[Current thread is (\d+)", text)
    number = current.group(1) if current else "1"
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if re.match(rf"Thread {number} \(", line)), None)
    if start is None:
        return ""
    body = []
    for line in lines[start + 1:]:
        if line.startswith("Thread ") or (body and not line.strip()):
            break
        if line.startswith("#"):
            body.append(line)
    return "\n".join([lines[start], *body[:frames]])
