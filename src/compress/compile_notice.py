"""One line on standard error while Numba compiles for long.

The first call of a kernel with a new signature compiles it (seconds per kernel; the shm round
driver takes about ten) unless Numba's cache holds it. :func:`install` registers a listener for
Numba's ``numba:compile`` events (they fire only for a real compile, never for a kernel found in
the cache, so a warm call costs nothing). The compiles that follow each other within
:data:`GAP` seconds make one *stall*; when a stall has lasted :data:`THRESHOLD_ENV` seconds
(default :data:`THRESHOLD`), rank 0 (of ``COMM_WORLD``, when MPI runs; every process that runs
alone) prints, once per stall::

    collectives: compiling Numba kernel run_rounds(float32, ...) for its first use; it is cached
    afterwards (in ...); `python -m collectives warmup` compiles the common ones ahead

(on one line; "in the background" when a thread of its own compiles while calls go on without
the kernel: "auto"'s shm allreduce does that). A timer thread prints it while the compile runs;
a compile that ends past the threshold before the timer thread got to run prints it at its end. ``COLLECTIVES_JIT_NOTICE=off``
turns the line off; ``COLLECTIVES_JIT_NOTICE=0`` prints it for every stall (tests).

:func:`install` is called by every module that defines kernels and imports Numba (this package's
``_kernels.host``, and collectives' shm and compressed kernels), so that the first compile of a
process is covered whichever path comes first. Importing this module imports Numba: only kernel
modules do, never ``import compress``.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from numba.core import event

__all__ = ["install", "THRESHOLD", "THRESHOLD_ENV", "GAP", "message"]

#: Seconds a stall lasts before the line is printed.
THRESHOLD = 2.0
#: Environment variable that overrides :data:`THRESHOLD` (seconds; ``off``: never print).
THRESHOLD_ENV = "COLLECTIVES_JIT_NOTICE"
#: Compiles that start within this many seconds of the last one's end continue its stall (one
#: call's kernels compile one after the other, with the work of the call between them).
GAP = 5.0

_RANK_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
_lock = threading.Lock()
_installed = False


def _threshold() -> float | None:
    text = os.environ.get(THRESHOLD_ENV, "").strip().lower()
    if text in ("off", "none", "no", "false"):
        return None
    try:
        return max(0.0, float(text)) if text else THRESHOLD
    except ValueError:
        return THRESHOLD


def _rank() -> int:
    """This process's rank in ``COMM_WORLD``: from mpi4py when MPI runs, else from the
    launcher's environment, else 0."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    for name in _RANK_ENV:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _cache_place() -> str:
    from numba.core import config

    return config.CACHE_DIR or "__pycache__ next to the kernels' sources"


def message(what: str, background: bool = False) -> str:
    """The line printed for a stall compiling ``what`` (``background``: in a thread of its own,
    while calls go on without it)."""
    where = " in the background (calls run without it meanwhile)" if background else ""
    return (f"collectives: compiling Numba kernel {what}{where} for its first use; it is cached "
            f"afterwards (in {_cache_place()}); `python -m collectives warmup` compiles the "
            f"common ones ahead")


def _describe(data: dict) -> str:
    fn = data["dispatcher"].py_func
    kinds = []
    for t in data["args"]:
        dtype = getattr(t, "dtype", None)
        name = str(dtype if dtype is not None else t)
        if name not in kinds:
            kinds.append(name)
    return f"{fn.__name__}({', '.join(kinds)})"


class _Stalls(event.Listener):
    """The ``numba:compile`` listener (compiles run one at a time, under Numba's compiler lock;
    nested events are the callees of the outermost kernel)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.depth = 0
        self.start = self.last_end = -1e300
        self.what = ""
        self.background = False
        self.said = True  # no stall yet
        self.timer: threading.Timer | None = None

    def on_start(self, ev) -> None:
        self.depth += 1
        if self.depth > 1:
            return
        now = time.perf_counter()
        self.what = _describe(ev.data)
        self.background = threading.current_thread() is not threading.main_thread()
        if now - self.last_end > GAP:  # a new stall
            self.start, self.said = now, _rank() != 0
        if self.said:
            return
        if self.timer is not None:
            self.timer.cancel()
        left = self.threshold - (now - self.start)
        if left <= 0:
            self._say()
            return
        self.timer = threading.Timer(left, self._check)
        self.timer.daemon = True
        self.timer.start()

    def on_end(self, ev) -> None:
        self.depth -= 1
        if self.depth > 0:
            return
        self.last_end = now = time.perf_counter()
        if now - self.start >= self.threshold:
            self._say()

    def _check(self) -> None:  # the timer thread: still compiling?
        if self.depth > 0:
            self._say()

    def _say(self) -> None:
        with _lock:
            if self.said:
                return
            self.said = True
        print(message(self.what, self.background), file=sys.stderr, flush=True)


def install() -> None:
    """Register the listener (once per process; nothing when the notice is off)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    threshold = _threshold()
    if threshold is None:
        return
    event.register("numba:compile", _Stalls(threshold))
