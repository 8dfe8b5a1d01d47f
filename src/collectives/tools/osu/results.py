"""Benchmark results as records, written to and read back from JSON or CSV files.

One :class:`Record` per (message size, algorithm). A JSON file holds
``{"benchmark", "ranks", "datatype", "argv", "complete", "records": [...]}``; a CSV file holds one
row per record with the field names of :class:`Record` as its header. Both are written to a
temporary file and renamed, so a reader never sees half a file. :func:`read_records` reads either
(by file suffix), which is what the plotting command and the tuner consume.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable

__all__ = ["Record", "write_json", "write_csv", "read_records"]


@dataclass(frozen=True)
class Record:
    """One measured (size, algorithm) point; latencies in microseconds, bandwidths in GB/s."""

    benchmark: str
    algorithm: str
    size: int
    ranks: int
    datatype: str
    avg_us: float
    min_us: float
    max_us: float
    median_us: float
    iterations: int
    algbw_gbs: float
    busbw_gbs: float
    valid: bool | None = None
    bytes_per_rank: float | None = None  # sent per call (--codec runs; native: ring estimate)


_CONVERT = {"size": int, "ranks": int, "iterations": int,
            "valid": lambda s: None if s in ("", "None") else s == "True",
            "bytes_per_rank": lambda s: None if s in ("", "None") else float(s)}


def _replace(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it and a rename."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_json(path: str | Path, records: Iterable[Record], **meta: object) -> None:
    """Write ``records`` (and metadata such as ``benchmark``, ``ranks``, ``argv``) as JSON."""
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v)
             for k, v in asdict(r).items()} for r in records]
    _replace(path, json.dumps({**meta, "records": rows}, indent=1) + "\n")


def write_csv(path: str | Path, records: Iterable[Record]) -> None:
    """Write ``records`` as CSV, one row each, header = the :class:`Record` field names."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[f.name for f in fields(Record)])
    writer.writeheader()
    for r in records:
        writer.writerow(asdict(r))
    _replace(path, buf.getvalue())


def _record(row: dict) -> Record:
    values = {}
    for f in fields(Record):
        raw = row.get(f.name)
        if f.name in _CONVERT:
            values[f.name] = _CONVERT[f.name](raw) if isinstance(raw, str) else raw
        elif f.name in ("benchmark", "algorithm", "datatype"):
            values[f.name] = str(raw)
        else:
            values[f.name] = float("nan") if raw in (None, "") else float(raw)
    return Record(**values)


def read_records(path: str | Path) -> list[Record]:
    """The records of a JSON or CSV results file (by suffix; anything else is read as JSON)."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        with open(path, newline="") as fh:
            return [_record(row) for row in csv.DictReader(fh)]
    data = json.loads(path.read_text())
    rows = data["records"] if isinstance(data, dict) else data
    return [_record(row) for row in rows]
