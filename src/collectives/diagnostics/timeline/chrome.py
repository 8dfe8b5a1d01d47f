"""The Chrome Trace Event Format: what a timeline is written as, merged and checked.

The JSON object form (``{"traceEvents": [...], ...}``) that Perfetto, ``chrome://tracing`` and
Horovod's timeline read. Each rank is one process (``pid`` = rank, named ``rank R`` by a
``process_name`` metadata event), each of its recording threads one lane (``tid``, named by a
``thread_name`` event: the caller's thread, ``collectives-engine ...``, ``collectives-named
...``). Every span is one complete event (``"ph": "X"``) with ``ts`` and ``dur`` in microseconds
on rank 0's clock (:mod:`.clock`), counted from rank 0's start; a lane's events are sorted by
start, outer spans first, so that spans of one lane nest.

Times are whole nanoseconds divided by 1000, so ``ts`` and ``ts + dur`` of nested spans compare
exactly once multiplied back (:func:`check` does).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

from .hooks import describe
from .recorder import Recorder

__all__ = ["rank_events", "document", "merge", "check", "read", "write"]

#: ``otherData`` key that marks a file as one of ours, with the format's version
MARK = "collectives_timeline"


def _args(category: str, args: Any, seq: int | None) -> dict[str, Any] | None:
    if category == "message":  # the peers, then what each expected
        half = len(args) // 2
        peers, expect = args[:half], args[half:]
        out: dict[str, Any] = {"to": [p for p, e in zip(peers, expect) if e is None],
                               "from": [p for p, e in zip(peers, expect) if e is not None]}
        received = sum(e for e in expect if e is not None)
        if received:
            out["bytes_received"] = received
        return out
    if category == "shm":
        nbytes, ranks = args
        return {"bytes": int(nbytes), "ranks": int(ranks)}
    if category == "reduce":
        op, nbytes = args
        return {"op": op, "bytes": int(nbytes)}
    if category in ("call", "request"):
        return describe(seq, args)
    if args:  # NumPy values as JSON
        return {k: v if type(v) in _JSON else _plain(v) for k, v in args.items()}
    return args


_JSON = (str, int, float, bool, list, tuple, type(None))


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)  # a NumPy scalar
    return item() if callable(item) and not hasattr(value, "names") else str(value)


def _message_name(expect: list) -> str:
    """An exchange round's name from what it waited for (None: a send; a size: a receive)."""
    sends = sum(e is None for e in expect)
    if sends == len(expect):
        return "send"
    return "recv" if sends == 0 else "sendrecv"


def rank_events(recorder: Recorder, rank: int, offset: float, origin: float) -> list[dict]:
    """Trace events of this process as rank ``rank``: metadata, then each lane's spans sorted by
    start (outer first). ``offset``: this clock minus rank 0's; ``origin``: rank 0's zero."""
    base = offset + origin
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
         "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
         "args": {"sort_index": rank}}]
    for lane in list(recorder.lanes):
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": lane.tid,
                    "args": {"name": lane.name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": lane.tid,
                    "args": {"sort_index": lane.tid}})
        spans = []
        for category, name, t0, t1, args, seq in list(lane.events):
            n0 = round((t0 - base) * 1e9)
            n1 = max(n0, round((t1 - base) * 1e9))
            spans.append((n0, -n1, category, name, args, seq))
        spans.sort(key=lambda s: (s[0], s[1]))
        for n0, minus_n1, category, name, args, seq in spans:
            if category == "message" and not name:
                name = _message_name(args[len(args) // 2:])
            event = {"name": name, "cat": category, "ph": "X", "ts": n0 / 1000,
                     "dur": (-minus_n1 - n0) / 1000, "pid": rank, "tid": lane.tid}
            info = _args(category, args, seq)
            if info:
                event["args"] = info
            out.append(event)
    return out


def document(events: list[dict], ranks: list[dict]) -> dict[str, Any]:
    """A trace file's object: ``events`` and, under ``otherData``, each rank's clock
    alignment (``ranks``: one dict per rank)."""
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {MARK: 1, "ranks": ranks}}


def merge(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One document from the rank files' (each rank once), in rank order."""
    docs = list(docs)
    by_rank: dict[int, dict] = {}
    for doc in docs:
        ranks = doc.get("otherData", {}).get("ranks")
        if not isinstance(ranks, list) or not ranks:
            raise ValueError("not a collectives timeline file (no otherData.ranks)")
        for info in ranks:
            rank = info["rank"]
            if rank in by_rank:
                raise ValueError(f"rank {rank} appears in two of the files")
            by_rank[rank] = info
    events = [e for doc in docs for e in doc["traceEvents"]]
    events.sort(key=lambda e: (e["pid"], e["ph"] != "M"))  # stable: each lane keeps its order
    return document(events, [by_rank[r] for r in sorted(by_rank)])


def check(doc: dict[str, Any]) -> None:
    """Raise ValueError naming the first problem of a trace document: events lacking ``ph``,
    ``ts``, ``pid`` or ``tid``; a complete event without ``dur >= 0``; a process or lane
    without its name; a lane whose starts go back in time; spans of one lane that overlap
    without nesting."""
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise ValueError("no traceEvents list")
    named_pids, named_lanes = set(), set()
    lanes: dict[tuple[int, int], list[dict]] = {}
    for i, e in enumerate(events):
        for key in ("ph", "pid", "tid", "name"):
            if key not in e:
                raise ValueError(f"event {i} has no {key!r}: {e}")
        if e["ph"] == "M":
            if e["name"] == "process_name":
                named_pids.add(e["pid"])
            elif e["name"] == "thread_name":
                named_lanes.add((e["pid"], e["tid"]))
            continue
        if e["ph"] != "X":
            raise ValueError(f"event {i} has phase {e['ph']!r}; a timeline has X and M only")
        if not isinstance(e.get("ts"), (int, float)):
            raise ValueError(f"event {i} has no numeric ts: {e}")
        if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
            raise ValueError(f"complete event {i} has no dur >= 0: {e}")
        lanes.setdefault((e["pid"], e["tid"]), []).append(e)
    for (pid, tid), spans in lanes.items():
        if pid not in named_pids:
            raise ValueError(f"process {pid} has no process_name")
        if (pid, tid) not in named_lanes:
            raise ValueError(f"lane {tid} of process {pid} has no thread_name")
        open_: list[tuple[int, dict]] = []  # the spans enclosing the current one: their ends
        last = None
        for e in spans:
            start = round(e["ts"] * 1000)
            end = start + round(e["dur"] * 1000)
            if last is not None and start < last:
                raise ValueError(f"lane {tid} of rank {pid}: {e['name']} starts at {e['ts']} "
                                 "before the span listed ahead of it")
            last = start
            while open_ and open_[-1][0] <= start:
                open_.pop()
            if open_ and end > open_[-1][0]:
                raise ValueError(f"lane {tid} of rank {pid}: {e['name']} at {e['ts']} overlaps "
                                 f"{open_[-1][1]['name']} without nesting in it")
            open_.append((end, e))


def read(path: str | os.PathLike) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write(doc: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``doc`` to ``path`` whole or not at all (a temporary file renamed into place)."""
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)
