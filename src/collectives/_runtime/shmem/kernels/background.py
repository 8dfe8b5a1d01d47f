"""A kernel compiled for one signature in a background thread (private).

:func:`ready` answers whether a Numba kernel has machine code for the types of some arguments
without compiling it in the caller's thread. The first time it is asked about a signature that
Numba's cache holds, it loads it (a fraction of a second) and answers True; else it starts a daemon
thread that compiles it (``dispatcher.compile``; the shm round driver takes seconds:
docs/benchmarks/first-call.md) and answers False until that is done. Whether
the cache holds it is read from the cache's index through Numba's private ``_cache`` attributes;
where they are not as expected, the thread is started and waited for at most ``wait`` seconds.
Numba compiles one kernel at a time (its compiler lock): a call that needs another compile
meanwhile waits for this one. The compile holds the GIL for most of its time, so the caller's
thread runs its Python in the interpreter's switch intervals meanwhile
(docs/benchmarks/first-call.md measures what that costs the calls made during the compile).

A compile that fails is not retried here: :func:`ready` then answers True, so that the caller
calls the kernel and gets the error where it would have without this module.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["ready"]

_lock = threading.Lock()
_threads: dict[tuple, threading.Thread] = {}
_failed: set[tuple] = set()


def _compile(key: tuple) -> None:
    dispatcher, sig = key
    try:
        dispatcher.compile(sig)
    except BaseException:  # noqa: BLE001 - re-raised by the caller's own call of the kernel
        _failed.add(key)


def _in_cache(dispatcher: Any, sig: tuple) -> bool | None:
    """Whether Numba's cache index has ``sig`` for ``dispatcher`` (None: cannot tell)."""
    try:
        cache = dispatcher._cache
        key = cache._index_key(sig, dispatcher.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:  # noqa: BLE001 - another Numba's internals, or no cache: cannot tell
        return None


def ready(dispatcher: Any, args: tuple, wait: float) -> bool:
    """Whether ``dispatcher`` can run on ``args`` without compiling (see the module docstring)."""
    from numba import typeof

    sig = tuple(typeof(a) for a in args)
    if sig in dispatcher.overloads:
        return True
    key = (dispatcher, sig)
    cached = _in_cache(dispatcher, sig) if key not in _threads else False
    if cached:
        dispatcher.compile(sig)  # a load (or, should the cached entry not load, the compile)
        return True
    with _lock:
        thread = _threads.get(key)
        started = thread is None
        if started:
            thread = _threads[key] = threading.Thread(
                target=_compile, args=(key,), daemon=True,
                name=f"collectives: compiling {dispatcher.py_func.__name__}")
            thread.start()
    if started and cached is None:
        thread.join(wait)
    return sig in dispatcher.overloads or key in _failed
