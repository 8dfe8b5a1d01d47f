"""``python -m collectives timeline merge run.rank*.json -o run.json``: merge rank files.

Each rank's file (written at exit when rank 0 could not merge them, or copied from other
machines) holds that rank's events on rank 0's clock already; merging puts them in one file,
checked (:func:`collectives.timeline.check`), that Perfetto opens as one trace.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import check, merge_files

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m collectives timeline",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge rank files into one trace")
    m.add_argument("files", nargs="+", help="the ranks' files (run.rank0.json ...)")
    m.add_argument("-o", "--output", required=True, help="the merged file to write")
    args = ap.parse_args(argv)
    try:
        doc = merge_files(args.files, args.output)
        check(doc)
    except (OSError, ValueError, KeyError) as exc:
        print(f"python -m collectives timeline merge: error: {exc}", file=sys.stderr)
        return 1
    ranks = len(doc["otherData"]["ranks"])
    spans = sum(e["ph"] == "X" for e in doc["traceEvents"])
    print(f"wrote {args.output}: {ranks} ranks, {spans} spans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
