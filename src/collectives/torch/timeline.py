"""Horovod's ``hvd.start_timeline``/``hvd.stop_timeline``, on :mod:`collectives.timeline`.

Horovod writes a Chrome-trace file of its operations; collectives' timeline writes one of every
collective of every rank (spans for each call, submit, wait and engine run; docs/timeline.md).
Both functions are collective over the default communicator (every rank calls them); rank 0
writes the file at ``stop_timeline()``. Horovod's ``HOROVOD_TIMELINE=file`` is
``COLLECTIVES_TIMELINE=file``.
"""

from __future__ import annotations

import os
from typing import Any

from ..diagnostics import timeline as _timeline
from .basics import default_comm

__all__ = ["start_timeline", "stop_timeline"]


def start_timeline(file_path: str | os.PathLike, mark_cycles: bool = False) -> None:
    """Start recording to ``file_path`` (``mark_cycles`` is Horovod's, for its fusion cycles,
    and has no counterpart: the engine's runs are spans already)."""
    _timeline.start(file_path, default_comm())


def stop_timeline() -> Any:
    """Stop recording; rank 0 writes the file (its path is returned there, None elsewhere)."""
    return _timeline.stop()
