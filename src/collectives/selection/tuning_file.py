"""Per-machine tuning files: for each world size, message-size thresholds -> algorithm.

``collectives-tune`` (``python -m collectives.tools.tuning.tune``) measures and writes one;
``algorithm="auto"`` reads it; these names are also ``collectives.selection.<name>``. Where it is
looked for, in order:

1. ``$COLLECTIVES_TUNING_FILE`` if set (an empty value, ``none`` or ``off`` disables tuning);
2. ``$XDG_CACHE_HOME/collectives/tuning.json``, ``XDG_CACHE_HOME`` defaulting to ``~/.cache``.

The file (JSON)::

    {"format": "collectives-tuning", "version": 1, "host": "...", "mpi": "...",
     "world_sizes": {"4": {"rules": [{"max_bytes": 65536, "algorithm": "native"},
                                     {"max_bytes": null, "algorithm": "hierarchical"}],
                           "nodes": [2, 2],
                           "model": {"alpha": 2e-06, "beta": 1.5e-10, "gamma": 1e-10,
                                     "alpha_native": 5e-07, "alpha_inter": 6e-05,
                                     "beta_inter": 8e-09, "node_size": 2},
                           "measured_us": {"8": {"native": 30.1, "ring": 80.2}},
                           "shm_cma_bytes": 262144}}}

A file may also hold ``"codecs"``: the codec pipeline's measured speed on this machine, by codec
spec, for ``codec="auto:..."`` (:mod:`collectives.compressed.auto`), seconds per byte::

     "codecs": {"topk:ratio=0.01": {"encode": 8e-10, "decode": 3e-10, "payload": 1.5e-09,
                                    "ranks": 4}}

``encode``: the encode (with error feedback where the codec needs it) per input byte; ``decode``:
writing the dense result per input byte; ``payload``: decoding and adding per payload byte;
``ranks``: how many ranks measured at once (the slowest one's time is kept).

Rules are read in order; the first whose ``max_bytes`` is >= the message size (``null``: no
limit) names the algorithm. ``nodes`` (optional) is the node layout the world was tuned on (the
ranks of each node, ``collectives._runtime.nodes.node_sizes``): ``auto`` follows the
rules only on a communicator with that layout (without ``nodes``: on one node). ``model`` holds
the fitted cost-model parameters (:class:`collectives.selection.cost_model.Network`; two levels when
it has ``alpha_inter``/``beta_inter`` and ``node_size``). A world size missing from the file gets
auto's built-in rule (or, across nodes, the two-level model). ``shm_cma_bytes`` (optional, one
node): the size from which the shm allreduce reads the other ranks' private buffers by
cross-memory attach rather than through the window's slots, as measured on this machine (which
one wins depends on how far apart the machine's cores are: docs/benchmarks/shm.md); without it
the team's built-in threshold. ``Options.shm_cma_bytes`` overrides either.

Errors: a missing file means "not tuned" (no message). A file that exists but cannot be read or
does not have this shape raises :class:`TuningFileError` naming the file and the problem: also a
hostile one (larger than :data:`MAX_FILE_BYTES`, nested deeper than Python's parser goes, world
size keys such as ``"²"`` or of thousands of digits, numbers beyond ``int``'s digit limit).
``auto`` reads the file on rank 0 only and broadcasts the verdict (the checked rules, or the
problem), so every rank takes the same path: with a problem, one ``RuntimeWarning`` on rank 0 and
the built-in rule, so a stale, half-written or hostile cache file never stops (or hangs) a
training job. The file is read once per process (:func:`clear_cache` forgets it, for tests).
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .names import TUNABLE

__all__ = ["ENV", "FORMAT", "VERSION", "MAX_FILE_BYTES", "TuningFileError", "Rules", "Entry",
           "default_path", "tuning_path", "read", "read_entries", "rules_for", "entry_for",
           "clear_cache", "make_rules", "write", "CODEC_SPEED_FIELDS", "read_codec_speeds",
           "codec_speeds"]

ENV = "COLLECTIVES_TUNING_FILE"
FORMAT = "collectives-tuning"
VERSION = 1
#: Larger tuning files are rejected unread (one world size's entry is about 2 KB).
MAX_FILE_BYTES = 16 << 20
#: World sizes are at most this many digits (int() of a longer key is refused or slow).
_MAX_KEY_DIGITS = 9

#: ``[(max_bytes, algorithm), ...]``, ``max_bytes`` increasing, the last one ``math.inf``.
Rules = list[tuple[float, str]]

#: the algorithms a rule may name
KNOWN = frozenset(TUNABLE)


@dataclass(frozen=True)
class Entry:
    """What a tuning file holds for one world size."""

    rules: Rules
    nodes: tuple[int, ...] | None = None  # the node layout it was tuned on (None: not recorded)
    model: dict[str, Any] | None = None   # fitted cost-model parameters
    shm_cma_bytes: int | None = None  # the shm allreduce's measured cross-memory attach threshold


class TuningFileError(ValueError):
    """A tuning file exists but is not usable; the message names the file and the problem."""


def default_path() -> Path:
    """``$XDG_CACHE_HOME/collectives/tuning.json`` (``~/.cache`` when unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "collectives" / "tuning.json"


def tuning_path() -> Path | None:
    """The file ``auto`` reads, or None when ``$COLLECTIVES_TUNING_FILE`` disables tuning."""
    raw = os.environ.get(ENV)
    if raw is None:
        return default_path()
    if raw.strip().lower() in ("", "none", "off"):
        return None
    return Path(raw).expanduser()


def _short(value: Any, width: int = 60) -> str:
    """``repr(value)``, cut to ``width`` characters (a hostile file's values can be huge)."""
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."


def _rules(path: Path, key: str, entry: Any, known: frozenset[str]) -> Rules:
    where = f"{path}: world size {key}"
    rules = entry.get("rules") if isinstance(entry, dict) else None
    if not isinstance(rules, list) or not rules:
        raise TuningFileError(f"{where}: 'rules' must be a non-empty list")
    out: Rules = []
    for k, rule in enumerate(rules):
        if not isinstance(rule, dict) or "algorithm" not in rule or "max_bytes" not in rule:
            raise TuningFileError(f"{where}: rule {k} must be {{'max_bytes': ..., "
                                  f"'algorithm': ...}}, got {_short(rule)}")
        name, limit = rule["algorithm"], rule["max_bytes"]
        if not isinstance(name, str) or name not in known:
            raise TuningFileError(f"{where}: rule {k}: unknown algorithm {_short(name)}; valid "
                                  f"choices: {', '.join(sorted(known))}")
        last = k == len(rules) - 1
        if limit is None and not last:
            raise TuningFileError(f"{where}: only the last rule may have max_bytes null")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 0 or (out and limit <= out[-1][0])):
            raise TuningFileError(f"{where}: rule {k}: max_bytes must be an integer larger "
                                  f"than the previous rule's, got {_short(limit)}")
        out.append((math.inf if limit is None else limit, name))
    if out[-1][0] != math.inf:
        raise TuningFileError(f"{where}: the last rule must have max_bytes null (no limit)")
    return out


def _entry(path: Path, key: str, entry: Any, known: frozenset[str]) -> Entry:
    rules = _rules(path, key, entry, known)
    nodes, model = entry.get("nodes"), entry.get("model")
    if nodes is not None and (not isinstance(nodes, list) or not nodes
                              or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                         for n in nodes) or sum(nodes) != int(key)):
        raise TuningFileError(f"{path}: world size {key}: 'nodes' must list the ranks of each "
                              f"node, adding up to {key}, got {nodes!r}")
    if model is not None and not isinstance(model, dict):
        raise TuningFileError(f"{path}: world size {key}: 'model' must be an object, "
                              f"got {model!r}")
    cma = entry.get("shm_cma_bytes")
    if cma is not None and (not isinstance(cma, int) or isinstance(cma, bool) or cma < 0):
        raise TuningFileError(f"{path}: world size {key}: 'shm_cma_bytes' must be a "
                              f"non-negative integer or null, got {_short(cma)}")
    return Entry(rules, None if nodes is None else tuple(nodes), model or None, cma)


def _load(path: Path) -> Any:
    """The JSON of ``path``, read only up to :data:`MAX_FILE_BYTES`; raises FileNotFoundError,
    or TuningFileError for anything else (too large, not UTF-8, not JSON, nested too deeply)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise TuningFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes; not a tuning file")
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: bad JSON, or an integer beyond int's digit limit; RecursionError: nesting
        if isinstance(exc, TuningFileError):
            raise
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise TuningFileError(f"{path}: not readable as JSON ({reason})") from None
    return data


def read(path: str | Path, known: frozenset[str] | None = None) -> dict[int, Rules]:
    """The rules of every world size in the tuning file ``path``.

    Raises FileNotFoundError when it does not exist and :class:`TuningFileError` when it is not
    a tuning file of this format (``known``: the valid algorithm names, default auto's choices:
    the flat algorithms and "shm").
    """
    return {p: e.rules for p, e in read_entries(path, known).items()}


def read_entries(path: str | Path, known: frozenset[str] | None = None) -> dict[int, Entry]:
    """Every world size's :class:`Entry` in the tuning file ``path`` (errors as :func:`read`)."""
    if known is None:
        known = KNOWN
    path = Path(path)
    data = _load(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TuningFileError(f"{path}: not a tuning file (expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise TuningFileError(f"{path}: version {_short(data.get('version'))} is not supported "
                              f"(this library reads version {VERSION}); rerun collectives-tune")
    sizes = data.get("world_sizes")
    if not isinstance(sizes, dict):
        raise TuningFileError(f"{path}: 'world_sizes' must be an object keyed by world size")
    table = {}
    for key, entry in sizes.items():
        if not (key.isascii() and key.isdigit() and len(key) <= _MAX_KEY_DIGITS) or int(key) < 1:
            raise TuningFileError(f"{path}: world size keys must be positive integers, "
                                  f"got {_short(key, 20)}")
        table[int(key)] = _entry(path, key, entry, known)
    return table


#: the per-byte times a ``"codecs"`` entry holds (seconds per byte)
CODEC_SPEED_FIELDS = ("encode", "decode", "payload")


def read_codec_speeds(path: str | Path) -> dict[str, dict[str, float]]:
    """The ``"codecs"`` section of the tuning file ``path`` (empty when it has none): codec spec
    -> ``{"encode": s/B, "decode": s/B, "payload": s/B}``. Errors as :func:`read`."""
    path = Path(path)
    data = _load(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TuningFileError(f"{path}: not a tuning file (expected \"format\": \"{FORMAT}\")")
    section = data.get("codecs", {})
    if not isinstance(section, dict):
        raise TuningFileError(f"{path}: 'codecs' must be an object keyed by codec spec")
    out = {}
    for spec, entry in section.items():
        if not isinstance(entry, dict):
            raise TuningFileError(f"{path}: codecs {_short(spec, 40)}: must be an object")
        speeds = {}
        for name in CODEC_SPEED_FIELDS:
            value = entry.get(name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not math.isfinite(value) or value < 0:
                raise TuningFileError(f"{path}: codecs {_short(spec, 40)}: {name!r} must be a "
                                      f"number of seconds per byte >= 0, got {_short(value)}")
            speeds[name] = float(value)
        out[str(spec)] = speeds
    return out


@functools.lru_cache(maxsize=None)
def _cached_speeds(path: Path) -> dict[str, dict[str, float]]:
    try:
        return read_codec_speeds(path)
    except FileNotFoundError:
        return {}


def codec_speeds() -> dict[str, dict[str, float]]:
    """The tuning file's ``"codecs"`` section (:func:`read_codec_speeds`; empty without a file or
    with tuning off), read once per process."""
    path = tuning_path()
    return {} if path is None else _cached_speeds(path)


@functools.lru_cache(maxsize=None)
def _cached(path: Path) -> dict[int, Entry] | None:
    try:
        return read_entries(path)
    except FileNotFoundError:
        return None
    except TuningFileError:
        raise
    except Exception as exc:  # anything else the file provokes is its fault too: one verdict
        raise TuningFileError(f"{path}: unusable ({type(exc).__name__}: {str(exc)[:200]})") from None


def entry_for(p: int) -> Entry | None:
    """The tuning file's :class:`Entry` for world size ``p``, or None (no file, tuning off,
    ``p`` not tuned). Reads the file once per process; raises :class:`TuningFileError` for a
    malformed file."""
    path = tuning_path()
    table = None if path is None else _cached(path)
    return None if table is None else table.get(p)


def rules_for(p: int) -> Rules | None:
    """The tuned rules for world size ``p``, or None (see :func:`entry_for`)."""
    entry = entry_for(p)
    return None if entry is None else entry.rules


def clear_cache() -> None:
    """Forget the files read so far (tests; after rewriting a tuning file in a process)."""
    _cached.cache_clear()
    _cached_speeds.cache_clear()


def make_rules(winners: dict[int, str]) -> list[dict[str, Any]]:
    """Rules from the winning algorithm at each measured size.

    A size between two measured ones takes the winner of the nearer one on a log scale (the
    threshold is their geometric mean); neighbours with the same winner merge.
    """
    sizes = sorted(winners)
    rules: list[dict[str, Any]] = []
    for k, size in enumerate(sizes):
        limit = None if k == len(sizes) - 1 else int(math.sqrt(size * sizes[k + 1]))
        if rules and rules[-1]["algorithm"] == winners[size]:
            rules[-1]["max_bytes"] = limit
        else:
            rules.append({"max_bytes": limit, "algorithm": winners[size]})
    return rules


def write(path: str | Path, world_sizes: dict[int, dict[str, Any]],
          codecs: dict[str, dict[str, Any]] | None = None, **meta: Any) -> Path:
    """Write (or merge into) the tuning file ``path``: entries for other world sizes and other
    codec specs (``codecs``: the ``"codecs"`` section's entries) are kept."""
    path = Path(path)
    try:  # keep the other world sizes and codecs of a valid file; replace anything else
        read(path)
        merged: dict[str, Any] = dict(_load(path)["world_sizes"])
        speeds: dict[str, Any] = dict(_load(path).get("codecs") or {})
    except (FileNotFoundError, TuningFileError, AttributeError, TypeError):
        merged, speeds = {}, {}
    merged.update({str(p): entry for p, entry in world_sizes.items()})
    speeds.update(codecs or {})
    data = {"format": FORMAT, "version": VERSION, **meta,
            "world_sizes": dict(sorted(merged.items(), key=lambda kv: int(kv[0])))}
    if speeds:
        data["codecs"] = speeds
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path
