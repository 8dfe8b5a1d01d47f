"""Tunable settings of the collectives, with environment-variable defaults.

Settings that tests shrink (segment sizes) or that describe the machine (emulated node size) live
here, not in function signatures, following Gloo's ``AllreduceOptions``.

- :class:`Options`: the settings of one call; :meth:`Options.from_env` makes them from the
  environment variables of :data:`ENV`;
- :func:`raw_values`: those variables' values as read, before any parsing (what
  :meth:`Options.from_env` reads at every call, and its cache key; bench/options_env.py times it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Options", "ENV", "raw_values"]

#: Environment variables read by :meth:`Options.from_env`, by field.
ENV = {
    "segment_bytes": "COLLECTIVES_SEGMENT_BYTES",
    "node_size": "COLLECTIVES_NODE_SIZE",
    "inter_algorithm": "COLLECTIVES_INTER_ALGORITHM",
    "validate": "COLLECTIVES_VALIDATE",
    "shm_segment_bytes": "COLLECTIVES_SHM_SEGMENT_BYTES",
    "timeout": "COLLECTIVES_TIMEOUT",
    "stall_warning": "COLLECTIVES_STALL_WARNING",
    "on_error": "COLLECTIVES_ON_ERROR",
}


def _env_int(name: str, raw: str | None, default: int | None) -> int | None:
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _env_seconds(name: str, raw: str | None, default: float | None) -> float | None:
    """Seconds from the environment: a number, or "off"/"0"/"none" for None (disabled)."""
    if raw is None or raw == "":
        return default
    if raw.lower() in ("off", "none", "0"):
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number of seconds "
                         "(or 'off')") from None


def _env_choice(name: str, raw: str | None, default: str, choices: tuple[str, ...]) -> str:
    if raw is None or raw.strip() == "":
        return default
    if raw.strip().lower() not in choices:
        raise ValueError(f"environment variable {name}={raw!r} is not one of "
                         f"{', '.join(choices)}")
    return raw.strip().lower()


def _check_seconds(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not value > 0):
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")


@dataclass(frozen=True)
class Options:
    """Settings for one call (or the process, through environment variables).

    Attributes
    ----------
    segment_bytes
        Largest message the pipelined algorithms ("ring", "tree") send in one piece. Tests shrink it
        so that small arrays take the multi-segment path. Default 1 MiB.
    node_size
        Group ranks into emulated nodes of this many ranks (inside each real shared-memory node) for
        "hierarchical"; None uses the real nodes from ``Split_type(COMM_TYPE_SHARED)``. The last
        node of a machine may be smaller.
    inter_algorithm
        Flat algorithm "hierarchical" runs across nodes.
    validate
        Cross-check count, dtype, op and algorithm across ranks with one small collective.
    shm_segment_bytes
        Bytes each rank stages per round in the "shm" algorithm (and inside "hierarchical"):
        the size of one slot of its shared window, which holds four (two in, two out). Tests
        shrink it so that small arrays take many rounds. None (default): 64 KiB per rank when
        the node's ranks have a core each (a call by cross-memory attach, which stages nothing,
        takes rounds of 1 MiB), 4 MiB when they share cores (each round then costs a turn of
        the scheduler, so fewer, larger rounds win).
    timeout
        Seconds after which a blocking call raises ``TimeoutError`` naming the call, on the
        rank that waited that long and, through its notice, on every rank still in the call
        (a rank that never makes the call gets the error when it does); and after which
        ``wait()`` of a non-blocking operation raises ``TimeoutError`` naming the operation
        (the operation itself stays in flight). None (the default) waits for ever, as MPI does.
    stall_warning
        Seconds after which a waiting ``wait()`` warns (:class:`collectives.StallWarning`) which
        ranks have not submitted the operation it waits for (Horovod's stall check); None
        disables the warning. Default 60.
    on_error
        What an error inside a blocking call does. ``"raise"`` (default): it is raised on every
        rank that needs it and the job goes on (``collectives._runtime.guard``; every wait also
        watches for other ranks' failures, a few microseconds a call). ``"abort"``: the call runs
        plain blocking MPI, as Horovod and DDP do, and an error on any rank, or a call longer than
        ``timeout``, prints that rank's error and ends the whole job (``MPI_Abort``;
        ``collectives._runtime.abort_mode``). Non-blocking operations keep ``"raise"``'s semantics.
        docs/reliability.md says when to use which.
    timeline
        A file to record a timeline to (:mod:`collectives.timeline`), or None (default). The
        first call made with it starts the recording, collectively over the call's communicator
        (whose ranks become the timeline's processes), unless one is recording already; the
        recording ends at ``collectives.timeline.stop()`` or at exit, where rank 0 writes the
        file, as with ``COLLECTIVES_TIMELINE``. Once per file and process: after a stop, later
        calls with the same file record nothing more. Like every option, the same on every
        rank of the call.
    shm_cma_bytes
        Bytes from which the "shm" allreduce reads the other ranks' private buffers by
        cross-memory attach (``process_vm_readv``) instead of staging them through the slots,
        where the kernel allows it. None (default): the one ``collectives-tune`` measured for the
        communicator's size on this machine (the tuning file's ``shm_cma_bytes``), else the
        team's own for the MPI library and the machine (``collectives/algorithms/shm.py``); 0:
        at every size; a size above any call: never. A team is made per value (a window each),
        so that tests and bench/shm_thresholds.py can compare both transfers; "hierarchical"
        keeps the built-in threshold.
    """

    segment_bytes: int = 1 << 20
    node_size: int | None = None
    inter_algorithm: str = "ring"
    validate: bool = False
    shm_segment_bytes: int | None = None
    timeout: float | None = None
    stall_warning: float | None = 60.0
    on_error: str = "raise"
    timeline: str | None = None
    shm_cma_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.segment_bytes, int) or self.segment_bytes < 1:
            raise ValueError(f"segment_bytes must be a positive integer, got {self.segment_bytes!r}")
        if self.shm_segment_bytes is not None and (not isinstance(self.shm_segment_bytes, int)
                                                   or self.shm_segment_bytes < 1):
            raise ValueError("shm_segment_bytes must be a positive integer or None, got "
                             f"{self.shm_segment_bytes!r}")
        if self.shm_cma_bytes is not None and (not isinstance(self.shm_cma_bytes, int)
                                               or isinstance(self.shm_cma_bytes, bool)
                                               or self.shm_cma_bytes < 0):
            raise ValueError("shm_cma_bytes must be a non-negative integer or None, got "
                             f"{self.shm_cma_bytes!r}")
        if self.node_size is not None and (not isinstance(self.node_size, int)
                                           or self.node_size < 1):
            raise ValueError(f"node_size must be a positive integer or None, got {self.node_size!r}")
        if self.inter_algorithm in ("hierarchical", "auto"):
            raise ValueError("inter_algorithm must be a flat algorithm, not "
                             f"{self.inter_algorithm!r}")
        _check_seconds("timeout", self.timeout)
        _check_seconds("stall_warning", self.stall_warning)
        if self.on_error not in ("raise", "abort"):
            raise ValueError(f"on_error must be 'raise' or 'abort', got {self.on_error!r}")
        if self.timeline is not None:
            if not isinstance(self.timeline, (str, os.PathLike)) or not os.fspath(self.timeline):
                raise ValueError("timeline must be a file name or None, got "
                                 f"{self.timeline!r}")
            object.__setattr__(self, "timeline", os.fspath(self.timeline))

    @classmethod
    def from_env(cls) -> "Options":
        """Defaults, overridden by the ``COLLECTIVES_*`` environment variables in :data:`ENV`.

        The variables are read at every call of this method (through the C library's
        ``getenv``: a change made through ``os.environ``, ``os.putenv`` or ``monkeypatch`` is
        seen at once), and every collective called without ``options=`` calls it, except one:
        a *remembered* call, an ``allreduce`` or ``iallreduce`` repeated on the same arrays
        (``collectives._runtime.repeats``), keeps the options its first call read, as NCCL and
        MPI read their environment once, at initialisation. To make such a repeat see a new
        environment, pass ``options=Options.from_env()``, or ``collectives.reset(comm)``.
        What a read costs: bench/options_env.py.
        """
        return _from_values(raw_values())


def _c_getenv():
    """The C library's ``getenv`` (bytes without NUL in, bytes or None out), called with the GIL
    held, or None where there is none to call (not POSIX).

    Through public APIs only. On POSIX every change to ``os.environ``/``os.environb`` is made in
    the C environment too (``putenv``/``unsetenv``, which ``monkeypatch.setenv`` goes through),
    so C ``getenv`` reads what those mappings hold (and what the MPI library reads its own
    variables from). It is the cheap read: ``os.environb.get`` raises and catches ``KeyError``
    twice for an unset variable, and the seven variables are read at every call
    (docs/benchmarks.md, "Numbers behind the code"). Holding the GIL (``PyDLL``) keeps the read
    from racing a Python thread's ``putenv``, which holds it too.
    """
    if os.name != "posix":  # pragma: no cover - Windows
        return None
    try:
        import ctypes  # NumPy imports it already

        getenv = ctypes.PyDLL(None).getenv
    except (OSError, AttributeError):  # pragma: no cover - a libc without getenv
        return None
    getenv.restype = ctypes.c_char_p  # no argtypes: bytes pass as char * unconverted (cheaper)
    return getenv


if os.supports_bytes_environ:
    _KEYS: tuple = tuple(os.fsencode(name) for name in ENV.values())
    _GET = _c_getenv() or os.environb.get
else:  # pragma: no cover - Windows
    _KEYS = tuple(ENV.values())
    _GET = os.environ.get


def raw_values() -> tuple:
    """The raw values of the variables of :data:`ENV`, in its order: bytes on POSIX (str where
    the platform has no bytes environment), None where a variable is unset, nothing parsed or
    checked. This is the read that :meth:`Options.from_env` makes at every call (through the C
    library's ``getenv`` where there is one), and the key of its cache of parsed options."""
    return tuple(map(_GET, _KEYS))


def _text(raw) -> str | None:
    return os.fsdecode(raw) if isinstance(raw, bytes) else raw


@lru_cache(maxsize=16)
def _from_values(raw: tuple[str | None, ...]) -> Options:
    values = {field: _text(value) for field, value in zip(ENV, raw)}
    return Options(
        segment_bytes=_env_int(ENV["segment_bytes"], values["segment_bytes"], Options.segment_bytes),
        node_size=_env_int(ENV["node_size"], values["node_size"], None),
        inter_algorithm=values["inter_algorithm"] or Options.inter_algorithm,
        validate=(values["validate"] or "0").lower() in ("1", "true", "yes", "on"),
        shm_segment_bytes=_env_int(ENV["shm_segment_bytes"], values["shm_segment_bytes"], None),
        timeout=_env_seconds(ENV["timeout"], values["timeout"], None),
        stall_warning=_env_seconds(ENV["stall_warning"], values["stall_warning"],
                                   Options.stall_warning),
        on_error=_env_choice(ENV["on_error"], values["on_error"], Options.on_error,
                             ("raise", "abort")),
    )
