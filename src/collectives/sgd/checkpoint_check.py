"""Reading a checkpoint that may be hostile: everything checked against what this run writes.

Rank 0 reads the checkpoint and broadcasts a verdict before anything else
(:func:`collectives.sgd.checkpoint.load`), so a file must never make it hang, crash, allocate
without bound or resume a job from state that does not fit. :func:`read_checked` checks, in this
order, and raises ``ValueError`` with one line naming the file and the first problem:

1. ``meta`` (JSON text of at most :data:`META_MAX_CHARS` characters): :func:`check_meta` - format
   version, world size, fingerprint of the model and options, ``step`` an integer in
   ``[0, total steps]`` (a multiple of H under local SGD), ``history`` one record of numbers per
   epoch done, ``elapsed`` and ``clock`` non-negative numbers; nothing else.
2. The member names: exactly those this run writes (:class:`Member` by name, from the driver),
   so a missing momentum or an extra array is refused.
3. Every member's size in the zip directory, before anything is decompressed: at most
   :data:`HEADER_MAX` bytes of ``.npy`` header plus the expected data. Reading never goes
   beyond that either, whatever the directory claims, so a small compressed member cannot
   expand to more (a zip bomb).
4. Every member's ``.npy`` header, before its data: exactly the expected dtype and shape (a
   header claiming 2**33 elements, or parameters of shape ``(1,)`` that NumPy would broadcast
   into every weight, are refused unread); text members (meta, generator states) a scalar
   string of bounded length.
5. The data: exactly as many bytes as the header implies.
"""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from dataclasses import dataclass
from math import prod
from typing import IO, Any, Callable

import numpy as np

__all__ = ["Member", "HEADER_MAX", "META_MAX_CHARS", "read_checked", "check_meta"]

#: The most bytes a member's ``.npy`` header may take (NumPy writes 128 for these arrays).
HEADER_MAX = 4096
#: The most characters of the ``meta`` JSON (a few hundred, plus ~250 per epoch of history).
META_MAX_CHARS = 1 << 20
#: The most characters of any other text member (a generator's state is ~170).
TEXT_MAX_CHARS = 1 << 12
_TEXT = "U"
_MAX_CLOCK_NAMES = 32


class _Problem(ValueError):
    """What is wrong with a readable checkpoint (a phrase after "checkpoint PATH")."""


@dataclass(frozen=True)
class Member:
    """What one array of the checkpoint must be: ``dtype`` (a NumPy dtype string such as
    ``"<f4"``, or ``"U"``: a scalar string of at most ``max_chars`` characters) and ``shape``."""

    dtype: str
    shape: tuple[int, ...] = ()
    max_chars: int = 0

    @classmethod
    def text(cls, max_chars: int = TEXT_MAX_CHARS) -> "Member":
        return cls(_TEXT, (), max_chars)

    @classmethod
    def like(cls, value: np.ndarray) -> "Member":
        """The member an array like ``value`` (as this run would write it) must match."""
        value = np.asarray(value)
        if value.dtype.kind == _TEXT:
            return cls.text()
        return cls(value.dtype.str, tuple(value.shape))

    @property
    def nbytes(self) -> int:
        if self.dtype == _TEXT:
            return 4 * self.max_chars
        return np.dtype(self.dtype).itemsize * prod(self.shape)

    def describe(self) -> str:
        if self.dtype == _TEXT:
            return f"text of at most {self.max_chars} characters"
        return f"{np.dtype(self.dtype).name} of shape {self.shape}"

    def problem(self, dtype: np.dtype, shape: tuple[int, ...]) -> str | None:
        """Why an array of ``dtype`` and ``shape`` is not this member (None if it is)."""
        if self.dtype == _TEXT:
            ok = dtype.kind == _TEXT and shape == () and dtype.itemsize // 4 <= self.max_chars
        else:
            ok = dtype == np.dtype(self.dtype) and tuple(shape) == self.shape
        if ok:
            return None
        return f"{dtype.name if dtype.kind != 'O' else 'object'} of shape {tuple(shape)}, " \
               f"expected {self.describe()}"


def _short(names: list[str], most: int = 4) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _read_member(f: IO[bytes], name: str, member: Member) -> np.ndarray:
    """One ``.npy`` member: header checked against ``member`` before any data is read."""
    fmt = np.lib.format
    version = fmt.read_magic(f)
    readers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
    if version not in readers:
        raise _Problem(f"has member {name} in .npy format version {version}, not 1.0 or 2.0")
    shape, fortran, dtype = readers[version](f, max_header_size=HEADER_MAX)
    problem = member.problem(dtype, tuple(shape))
    if problem:
        raise _Problem(f"has member {name} of {problem}")
    if fortran and len(shape) > 1:
        raise _Problem(f"has member {name} in Fortran order; checkpoints are written in C order")
    nbytes = dtype.itemsize * prod(shape)
    data = f.read(nbytes + 1)
    if len(data) != nbytes:
        raise _Problem(f"has member {name} with {len(data)} bytes of data, its header implies "
                       f"{nbytes}")
    return np.frombuffer(data, dtype).reshape(shape).copy()


def read_checked(path: str, expected: dict[str, Member] | Callable[[dict], dict[str, Member]],
                 expect_meta: dict[str, Any] | None) -> tuple[dict, dict[str, np.ndarray]]:
    """``(meta, arrays)`` of the checkpoint at ``path``, checked (module docstring); raises
    ValueError naming the file and the problem. ``expected`` may depend on the checked meta
    (a function of it: what a run writes may change with the step). ``expect_meta`` None: a
    file without ``meta`` (a rank's shard), checked from step 2 on; ``meta`` is then None."""
    layout = expected
    expected = {"meta": Member.text(META_MAX_CHARS)}
    if expect_meta is None:
        expected = layout
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {info.filename: info for info in zf.infolist()}

            def member(name: str) -> np.ndarray:
                info = infos[name + ".npy"]
                if info.file_size > HEADER_MAX + expected[name].nbytes:
                    raise _Problem(f"has member {name} that would expand to {info.file_size} "
                                   f"bytes, more than its {expected[name].describe()} can take")
                with zf.open(info) as f:
                    return _read_member(f, name, expected[name])

            meta = None
            if expect_meta is not None:
                if "meta.npy" not in infos:
                    raise _Problem("lacks meta")
                meta = check_meta(str(member("meta")), expect_meta)
                expected = layout(meta) if callable(layout) else layout
            names = {n[:-len(".npy")] if n.endswith(".npy") else n for n in infos}
            missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
            if missing:
                raise _Problem(f"lacks {_short(missing)}")
            if extra or len(infos) != len(names):
                raise _Problem(f"holds members this run does not write: {_short(extra)}")
            for name in expected:  # every size before any data
                if infos[name + ".npy"].file_size > HEADER_MAX + expected[name].nbytes:
                    member(name)  # raises
            return meta, {name: member(name) for name in expected if name != "meta"}
    except FileNotFoundError:
        raise ValueError(f"no checkpoint at {path}") from None
    except _Problem as e:
        raise ValueError(f"checkpoint {path} {e}") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, RuntimeError, NotImplementedError,
            ValueError) as e:  # RuntimeError: encrypted; NotImplementedError: compression method
        raise ValueError(f"cannot read checkpoint {path}: {' '.join(str(e).split())[:300]}") \
            from None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _differences(theirs: Any, ours: str) -> str:
    try:
        a, b = json.loads(theirs), json.loads(ours)
    except (TypeError, ValueError, RecursionError):
        return "fingerprints differ"
    if not isinstance(a, dict):
        return "fingerprints differ"
    diff = [f"{k} {str(a.get(k))[:60]} there, {b.get(k)} here" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)][:8]
    return "; ".join(diff) or "fingerprints differ"


def check_meta(text: str, expect: dict[str, Any]) -> dict:
    """The ``meta`` JSON checked against ``expect`` (``version``, ``world``, ``fingerprint``,
    ``config``, ``total_steps``, ``steps_per_epoch``, ``step_multiple``, ``history_keys``);
    raises ValueError (a phrase to follow "checkpoint PATH")."""
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError):
        raise _Problem("has a meta that is not JSON") from None
    if not isinstance(meta, dict):
        raise _Problem("has a meta that is not a JSON object")
    if meta.get("version") != expect["version"]:
        raise _Problem(f"has format version {str(meta.get('version'))[:20]}, this program "
                         f"reads {expect['version']}")
    if meta.get("world") != expect["world"]:
        raise _Problem(f"was written by {str(meta.get('world'))[:20]} ranks, this job has "
                         f"{expect['world']}")
    if meta.get("fingerprint") != expect["fingerprint"]:
        raise _Problem("is from another model or configuration: "
                         + _differences(meta.get("config"), expect["config"]))
    fields = {"version", "world", "fingerprint", "config", "step", "history", "elapsed", "clock"}
    if set(meta) != fields:
        raise _Problem(f"has meta fields {_short(sorted(map(str, meta)), 10)}, expected "
                         f"{', '.join(sorted(fields))}")
    step, total, multiple = meta["step"], expect["total_steps"], expect["step_multiple"]
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= total \
            or step % multiple:
        raise _Problem(f"has step {str(step)[:30]}, not an integer from 0 to this run's {total} "
                         f"steps" + (f" and a multiple of {multiple}" if multiple > 1 else ""))
    history, epochs = meta["history"], step // expect["steps_per_epoch"]
    keys = set(expect["history_keys"])
    if not isinstance(history, list) or len(history) != epochs or not all(
            isinstance(h, dict) and set(h) == keys and all(map(_number, h.values()))
            for h in history):
        raise _Problem(f"has a history that is not {epochs} epoch records of numbers "
                         f"({', '.join(sorted(keys))})")
    elapsed, clock = meta["elapsed"], meta["clock"]
    if not (_number(elapsed) and math.isfinite(elapsed) and elapsed >= 0):
        raise _Problem(f"has elapsed {str(elapsed)[:30]}, not a non-negative number of seconds")
    if not isinstance(clock, dict) or len(clock) > _MAX_CLOCK_NAMES or not all(
            len(k) <= 64 and _number(v) and math.isfinite(v) and v >= 0 for k, v in clock.items()):
        raise _Problem("has a clock that is not an object of at most 32 non-negative numbers "
                       "of seconds")
    return meta
