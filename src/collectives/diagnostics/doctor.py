"""``python -m collectives doctor DIR``: every rank's flight-recorder dump, explained in one line
per problem.

Reads ``rank-<R>.json`` of every rank of one job (:mod:`collectives.flight_recorder`) and
compares, per communicator, the calls the ranks recorded under the same call number (every rank
numbers its calls on a communicator alike, so call ``#s`` must be the same collective on every
rank):

- a rank without a dump: ``rank 2 has no dump``;
- the first call number at which the ranks' calls differ: another collective (``rank 1 called
  bcast #12 where the others called allreduce #12``), another count (``count mismatch at
  allreduce #40: 1024 on ranks 0, 1; 1000 on rank 2``), dtype or op;
- a hang: the ranks that wait in (or timed out in) the latest call (and for which ranks, where
  their last wait says), and where each other rank is: still in an earlier call (``ranks 0, 1, 3
  wait in allreduce #58 (grad.fc1, 4 MiB); rank 2 is still in allreduce #57``), or outside the
  library since its last call ended (``rank 3 is in compute: its last call #57 finished 12.0 s
  before the others' dumps``), or gone on to later calls;
- a failed call, with the first error: ``allreduce #7 failed on ranks 0, 1, 2: ...``;
- non-blocking operations that some ranks have not submitted (a name, or a place in the order);
- point-to-point messages that waited when the dump was made, or timed out, with their peer
  and tag, and what the peer's dump says of the other half (``rank 1 timed out in recv from
  rank 0 (tag 7, 32 B): rank 0 has sent it nothing with tag 7 in its last 12 point-to-point
  messages``).

Dumps of different jobs are never compared with each other. Each job dumps into a folder of its
own (``collectives-dump/<job id>/``), and each file names its job (``job``): given the folder of
one job, the doctor explains it; given a folder of several (``collectives-dump``), it explains the
newest (the job whose dumps are the latest) and says so in its first line, naming the others;
``--all`` explains every job, each under a line ``job <id>:``. Files without a job id (from
before ids were written) count as the job of their folder.

Exit status 1 if it found a problem, 0 (``no problem found``) if not, 2 if there are no dumps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

__all__ = ["jobs", "load", "diagnose", "main"]

_ROLES = {"blocking": 0, "engine": 1, "named": 2}


def jobs(directory: str | Path) -> dict[str, dict[int, dict[str, Any]]]:
    """Every ``rank-<R>.json`` in ``directory`` and in its folders (one per job), by job id and
    rank, oldest job first (the time of its latest dump); a file without a job id counts as its
    folder's job. Files that do not parse are skipped with a line on stderr."""
    root = Path(directory)
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted([*root.glob("rank-*.json"), *root.glob("*/rank-*.json")]):
        try:
            data = json.loads(path.read_text())
            rank = int(data["rank"])
        except (ValueError, KeyError, TypeError, OSError) as exc:
            print(f"collectives doctor: skipping {path}: {exc}", file=sys.stderr)
            continue
        job = data.get("job") or (path.parent.name if path.parent != root else str(root))
        found.setdefault(str(job), {})[rank] = data
    return dict(sorted(found.items(), key=lambda item: (_latest(item[1]), item[0])))


def _latest(dumps: dict[int, dict[str, Any]]) -> float:
    return max(float(d.get("time") or 0.0) for d in dumps.values())


def load(directory: str | Path, job: str | None = None) -> dict[int, dict[str, Any]]:
    """The dumps of one job in ``directory`` (:func:`jobs`), by rank: job ``job``, default the
    newest; empty if there are none."""
    found = jobs(directory)
    if not found:
        return {}
    return found[job] if job is not None else found[list(found)[-1]]


def _ranks(ranks: Any) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return ""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def _call(rec: dict[str, Any], detail: bool = False) -> str:
    """``allreduce #58``, with ``(grad.fc1, 4 MiB)`` if ``detail``."""
    text = f"{rec['kind']} #{rec['seq']}"
    if detail:
        parts = [p for p in (rec.get("name"), _size(rec.get("bytes"))) if p]
        if parts:
            text += f" ({', '.join(parts)})"
    return text


def _waiting(rec: dict[str, Any]) -> bool:
    """The call was waiting when the dump was made, or gave up waiting (a timeout)."""
    return rec["state"] == "started" or (rec["state"] == "failed"
                                         and str(rec.get("error")).startswith("TimeoutError"))


def _group(values: dict[int, Any]) -> list[tuple[Any, list[int]]]:
    """``{rank: value}`` as (value, ranks), the value most ranks have first."""
    by: dict[Any, list[int]] = {}
    for rank, value in sorted(values.items()):
        by.setdefault(value, []).append(rank)
    return sorted(by.items(), key=lambda item: (-len(item[1]), item[1]))


def _mismatch(seq: int, recs: dict[int, dict[str, Any]]) -> str | None:
    """The line for the first field in which the ranks' calls number ``seq`` differ, or None."""
    kinds = _group({r: rec["kind"] for r, rec in recs.items()})
    if len(kinds) > 1:
        common, _ = kinds[0]
        if len(kinds[0][1]) > len(kinds[1][1]):
            return "; ".join(f"{_ranks(ranks)} called {kind} #{seq} where the others called "
                             f"{common} #{seq}" for kind, ranks in kinds[1:])
        return f"the ranks called different collectives as #{seq}: " + "; ".join(
            f"{kind} on {_ranks(ranks)}" for kind, ranks in kinds)
    kind = kinds[0][0]
    for field in ("count", "dtype", "op", "name"):
        known = {r: rec[field] for r, rec in recs.items() if rec.get(field) is not None}
        values = _group(known)
        if len(values) > 1:
            return f"{field} mismatch at {kind} #{seq}: " + "; ".join(
                f"{value} on {_ranks(ranks)}" for value, ranks in values)
    return None


def _communicator(cid: str, views: dict[int, dict[str, Any]], dumps: dict[int, dict[str, Any]],
                  world: int) -> list[str]:
    """The problems of one communicator (``views``: its dump on each rank that has one)."""
    lines: list[str] = []
    members = next(iter(views.values()))["members"]
    where = "" if members == list(range(world)) and cid.startswith("blocking 0 ") \
        else f" (communicator {cid})"
    records = {r: {rec["seq"]: rec for rec in v["records"]} for r, v in views.items()}
    # 1. the first call number where the ranks' calls differ
    mismatch_at = None
    common = sorted(set().union(*(set(recs) for recs in records.values())))
    for seq in common:
        recs = {r: records[r][seq] for r in records if seq in records[r]}
        if len(recs) < 2:
            continue
        line = _mismatch(seq, recs)
        if line is not None:
            lines.append(line + where)
            mismatch_at = seq
            break
    # 2. a hang: who waits in the latest call, and where the others are
    last = {r: recs[max(recs)] for r, recs in records.items() if recs}
    waiting = {r: rec for r, rec in last.items() if _waiting(rec)}
    if waiting:
        top = max(rec["seq"] for rec in waiting.values())
        group = sorted(r for r, rec in waiting.items() if rec["seq"] == top)
        head = waiting[group[0]]
        times = [dumps[r]["time"] for r in group]
        when = statistics.median(times)
        parts = []
        for rank in sorted(set(m for m in members if m in dumps) - set(group)):
            rec = last.get(rank)
            if rec is None:
                parts.append(f"rank {rank} has made no call on it")
            elif rec["seq"] > top:
                parts.append(f"rank {rank} has gone on to {_call(rec)}")
            elif _waiting(rec):
                parts.append(f"rank {rank} is still in {_call(rec)}")
            elif rec["state"] == "failed":
                parts.append(f"rank {rank}'s last call {_call(rec)} failed ({rec['error']})")
            else:
                ago = when - rec["end"]
                parts.append(f"rank {rank} is in compute: its last call {_call(rec)} finished "
                             f"{ago:.1f} s before the others' dumps")
        waits = "waits" if len(group) == 1 else "wait"
        peers = set()  # whom the group's last waits waited for, outside the group
        for rank in group:
            if isinstance(views[rank].get("waiting_for"), list):
                peers.update(views[rank]["waiting_for"])
        peers -= set(group)
        whom = f" for {_ranks(peers)}" if peers else ""
        if parts:
            lines.append(f"{_ranks(group)} {waits} in {_call(head, True)}{whom}{where}; "
                         + "; ".join(parts))
        elif mismatch_at != top and len(group) > 1:
            lines.append(f"{_ranks(group)} all {waits} in {_call(head, True)}{whom}{where}: "
                         "every rank made the call and it did not complete (a difference the recorder "
                         "does not see, such as the root or the counts of each rank, or a rank "
                         "outside the library)")
    # 3. failures that are not timeouts
    failed = {r: rec for r, rec in last.items() if rec["state"] == "failed" and not _waiting(rec)}
    for seq in sorted({rec["seq"] for rec in failed.values()}):
        if seq == mismatch_at:
            continue
        ranks = sorted(r for r, rec in failed.items() if rec["seq"] == seq)
        rec = failed[ranks[0]]
        lines.append(f"{_call(rec, True)} failed on {_ranks(ranks)}{where}: {rec['error']}")
    return lines


def _engines(dumps: dict[int, dict[str, Any]]) -> list[str]:
    """Non-blocking operations that some ranks submitted and others did not."""
    lines = []
    labels = sorted({e["label"] for d in dumps.values() for e in d.get("engines", [])})
    for label in labels:
        engines = {r: e for r, d in dumps.items() for e in d.get("engines", [])
                   if e["label"] == label and e.get("outstanding") is not None}
        named: dict[str, list[int]] = {}
        for rank, engine in engines.items():
            for op in engine["outstanding"]:
                if op["name"] is not None:
                    named.setdefault(op["name"], []).append(rank)
        for name, ranks in sorted(named.items()):
            others = sorted(set(engines) - set(ranks))
            if others:
                lines.append(f"{_ranks(ranks)} wait for the non-blocking operation {name!r} on "
                             f"{label}, which {_ranks(others)} "
                             f"{'has' if len(others) == 1 else 'have'} not submitted")
        ordered = {r: [op for op in e["outstanding"] if op["name"] is None]
                   for r, e in engines.items()}
        pending = [op for ops in ordered.values() for op in ops]
        if pending:
            first = min(pending, key=lambda op: op["seq"])
            behind = sorted(r for r, e in engines.items() if e["submitted"] <= first["seq"])
            if behind:
                lines.append(f"{_ranks(behind)} {'has' if len(behind) == 1 else 'have'} not "
                             f"submitted {first['description']} on {label} (the others have)")
    return lines


def _p2p_call(rec: dict[str, Any]) -> str:
    """``recv from rank 0 (tag 7, 32 B)``."""
    way = "to" if rec["side"] == "send" else "from"
    peer = rec.get("peer")
    who = "any rank" if peer == -1 else (f"rank {peer}" if peer is not None
                                         else f"rank {rec.get('peer_in_comm')} of a freed "
                                              "communicator")
    tag = "any tag" if rec.get("tag") == -1 else f"tag {rec.get('tag')}"
    return f"{rec['kind']} {way} {who} ({tag}, {_size(rec.get('bytes'))})"


def _pt2pt(dumps: dict[int, dict[str, Any]]) -> list[str]:
    """Point-to-point messages that wait (or timed out), and where their peers are."""
    lines = []
    for rank, d in sorted(dumps.items()):
        records = (d.get("pt2pt") or {}).get("records") or []
        for rec in records:
            if not _waiting(rec):
                continue
            verb = "waits in" if rec["state"] == "started" else "timed out in"
            line = f"rank {rank} {verb} {_p2p_call(rec)}"
            peer = rec.get("peer")
            if peer is not None and peer >= 0:
                line += "; " + _other_half(rank, rec, peer, dumps)
            lines.append(line)
    return lines


def _other_half(rank: int, rec: dict[str, Any], peer: int,
                dumps: dict[int, dict[str, Any]]) -> str:
    """What the dump of ``peer`` says of the message ``rec`` of ``rank`` waits for."""
    if peer not in dumps:
        return f"rank {peer} has no dump"
    records = (dumps[peer].get("pt2pt") or {}).get("records") or []
    side = "recv" if rec["side"] == "send" else "send"
    tag = rec.get("tag")
    halves = [r for r in records if r["side"] == side and r.get("peer") in (rank, -1)
              and (tag == -1 or r.get("tag") in (tag, -1))]
    verb = "received" if side == "recv" else "sent"
    what = "any tag" if tag == -1 else f"tag {tag}"
    if not halves:
        return (f"rank {peer} has {verb} it nothing with {what} in its last {len(records)} "
                "point-to-point messages")
    last = halves[-1]
    if _waiting(last):
        return f"rank {peer} is in {_p2p_call(last)} too (a size or dtype that differs?)"
    return f"rank {peer}'s last {_p2p_call(last)} {last['state']}"


def diagnose(dumps: dict[int, dict[str, Any]]) -> list[str]:
    """One line per problem found in the dumps (empty: none)."""
    if not dumps:
        return []
    lines = []
    sizes = sorted({d["size"] for d in dumps.values()})
    if len(sizes) > 1:
        lines.append(f"the dumps come from jobs of different sizes ({', '.join(map(str, sizes))}"
                     " ranks): they are not one job's; keep each job's dumps in a folder of "
                     "its own")
    world = sizes[-1]
    missing = [r for r in range(world) if r not in dumps]
    if missing:
        lines.append(f"{_ranks(missing)} {'has' if len(missing) == 1 else 'have'} no dump")
    comms: dict[str, dict[int, dict[str, Any]]] = {}
    for rank, d in sorted(dumps.items()):
        for comm in d["communicators"]:
            comms.setdefault(comm["id"], {})[rank] = comm
    for cid in sorted(comms, key=lambda c: (_ROLES.get(c.split()[0], 3), c)):
        lines.extend(_communicator(cid, comms[cid], dumps, world))
    lines.extend(_engines(dumps))
    lines.extend(_pt2pt(dumps))
    return lines


def _report(dumps: dict[int, dict[str, Any]], indent: str = "") -> bool:
    """Print the doctor's lines on one job's dumps; True if it found a problem."""
    lines = diagnose(dumps)
    for line in lines:
        print(indent + line)
    if not lines:
        world = max(d["size"] for d in dumps.values())
        print(f"{indent}no problem found ({len(dumps)} of {world} ranks' dumps)")
    return bool(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m collectives doctor",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", help="where the ranks' dumps are (COLLECTIVES_DUMP_DIR, or the "
                                      "folder of one job in it)")
    ap.add_argument("--all", action="store_true",
                    help="explain every job's dumps in the directory, each apart (default: the "
                         "newest job's)")
    args = ap.parse_args(argv)
    found = jobs(args.directory)
    if not found:
        print(f"collectives doctor: no dumps (rank-*.json) in {args.directory}", file=sys.stderr)
        return 2
    if len(found) == 1:
        return int(_report(next(iter(found.values()))))
    if args.all:
        problem = False
        for job, dumps in found.items():
            print(f"job {job}:")
            problem |= _report(dumps, "  ")
        return int(problem)
    *older, newest = found
    print(f"job {newest}: the newest of {len(found)} jobs' dumps in {args.directory} (older: "
          f"{', '.join(reversed(older))}; --all explains each, or name a job's folder)")
    return int(_report(found[newest]))


if __name__ == "__main__":
    sys.exit(main())
