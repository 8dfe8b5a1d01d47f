"""The C backtrace of a crashed rank (tests/backtrace.py): a process that faults in C leaves a
core, gdb reads the faulting thread's frames from it, and the core is deleted."""

import subprocess
import sys
import time

import pytest

import backtrace

CRASH = """
import ctypes, faulthandler, sys, threading
sys.path.insert(0, {tests!r})
from backtrace import allow_core
allow_core()
faulthandler.enable()
def fault():
    ctypes.string_at(0)  # reads address 0: SIGSEGV inside libc's strlen/memmove
t = threading.Thread(target=fault)
t.start(); t.join()
"""


@pytest.mark.skipif(not backtrace.enabled(), reason="gdb is not installed")
def test_a_crash_in_a_thread_gives_its_c_frames(tmp_path):
    began = time.time() - 1
    proc = subprocess.run([sys.executable, "-c", CRASH.format(tests=str(backtrace.__file__)
                                                              .rsplit("/", 1)[0])],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -11, proc.stderr
    core = backtrace.find_core(tmp_path, began)
    if core is None:
        pytest.skip("this system's core_pattern writes no core file in the working directory")
    assert backtrace.find_core(tmp_path, time.time() + 60) is None  # only cores since `since`
    text = backtrace.backtrace(core, sys.executable, tmp_path / "bt.txt")
    assert not core.exists() and (tmp_path / "bt.txt").read_text() == text
    frames = backtrace.crashed_thread(text)
    # the faulting thread, not the main one (which waits in join): ctypes' call into libc
    assert frames.startswith("Thread ") and "#0" in frames, text[-3000:]
    assert "string_at" in frames or "ffi_call" in frames or "strlen" in frames, frames
    assert "lock_PyThread_acquire_lock" not in frames.split("\n")[1], frames
