"""Body layout: named typed sections in one byte buffer (private).

A codec describes its body as a list of :class:`Section` (name, dtype, element count). Sections are
stored in order of decreasing item size (stable for equal sizes), so with an 8-byte aligned start every
section is naturally aligned and there is never any padding: the body size is exactly the sum of
``count * itemsize``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Section", "body_nbytes", "split_body"]


@dataclass(frozen=True)
class Section:
    """One array in a payload body."""

    name: str
    dtype: np.dtype
    count: int


def _ordered(sections):
    return sorted(sections, key=lambda s: -np.dtype(s.dtype).itemsize)


def body_nbytes(sections) -> int:
    """Exact size of a body made of ``sections``."""
    return sum(int(s.count) * np.dtype(s.dtype).itemsize for s in sections)


def split_body(buf: np.ndarray, offset: int, sections) -> dict[str, np.ndarray]:
    """Views of each section of the body that starts at ``buf[offset]`` (length must be checked)."""
    views = {}
    for s in _ordered(sections):
        n = int(s.count) * np.dtype(s.dtype).itemsize
        views[s.name] = buf[offset : offset + n].view(s.dtype)
        offset += n
    return views
