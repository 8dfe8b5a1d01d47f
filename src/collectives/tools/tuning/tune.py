"""``collectives-tune`` / ``python -m collectives.tools.tuning.tune``: measure this machine, write a tuning file.

Without ``mpiexec`` it launches itself under ``mpiexec -n P`` for every ``P`` of ``--ranks``
(default 2, 4, 8) and merges the results into the tuning file (default: where ``auto`` looks, see
:mod:`collectives.selection.tuning_file`); started under ``mpiexec`` it tunes that one world size.
Each world size:

1. fits the cost model: ping-pong between ranks 0 and 1 (alpha, beta), ``np.add`` (gamma), and
   the smallest native allreduce (alpha_native); see :mod:`collectives.tools.tuning.fit`. When the
   ranks span several nodes (``Split_type(COMM_TYPE_SHARED)``; a cluster, e.g.
   ``bench/cluster.py run -- collectives-tune``) it fits two levels: ping-pong between two ranks
   of rank 0's node (alpha, beta) and between rank 0 and the first rank of another node
   (alpha_inter, beta_inter), with the smallest node's size as ``node_size``, and records the
   layout (``nodes``), so ``auto`` follows these rules only on the same layout;
2. times every algorithm ``auto`` can pick (ring, tree, recursive doubling, Rabenseifner,
   native; "shm" when all ranks share a node, "hierarchical" across nodes) at a handful of
   sizes, 8 B to 64 MiB of float32, interleaved, OSU's timing (each call alone, then a barrier),
   with few iterations for big messages, twice, and keeps each algorithm's better (lower)
   per-rank median averaged over ranks, which filters passing load from other processes on a
   shared machine;
3. picks the winner at each size, keeping auto's built-in choice unless another algorithm is
   faster by more than ``--margin`` (default 5%, so noise cannot flip the rule), and stores the
   winners as thresholds (:func:`collectives.selection.tuning_file.make_rules`), with the measured
   times and the fitted model. On one node it also times "shm" through its slots only and by
   cross-memory attach only (columns ``shm:cma=never`` and ``shm:cma=0``, on arrays of their
   own) and stores where the second starts to win as ``shm_cma_bytes``
   (:func:`cma_threshold`): the shm allreduce's threshold on this machine, where the two cores'
   distance decides it (docs/benchmarks/shm.md).

4. measures the codec pipeline of each ``--codec`` spec (default :data:`DEFAULT_CODECS`) for
   ``codec="auto:<spec>"``: every rank at once, as in training, on ``--codec-elements`` float32
   (:func:`collectives.compressed.speed.measure_speed`), the slowest rank's seconds per byte kept
   in the file's ``"codecs"`` section (the last world size tuned replaces an earlier one's);
   ``--codec none`` measures none.

It takes a few minutes for 2, 4 and 8 ranks on 2 cores; ``--sizes`` and ``--quick`` shorten it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

from ..._runtime.cli import program
from ..launch import mpiexec_command

__all__ = ["DEFAULT_SIZES", "DEFAULT_CODECS", "main", "script", "fastest", "cma_threshold",
           "tune_world", "tune_codecs"]

DEFAULT_SIZES = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
ROUNDS = 2
#: the codec specs whose pipeline speed is measured by default (for codec="auto:<spec>")
DEFAULT_CODECS = ["topk:ratio=0.01", "topk:ratio=0.001", "dgc:density=0.001",
                  "randomk:ratio=0.01", "fp16"]
PINGPONG_SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 4 << 20, 8 << 20]
REDUCTION_SIZES = [64 << 10, 1 << 20, 16 << 20]
#: Environment variables an MPI launcher sets in its processes (MPICH/Hydra, Open MPI, Slurm).
LAUNCHER_ENV = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def _iterations(nbytes: int, quick: bool) -> tuple[int, int]:
    table = [(64 << 10, 100, 10), (1 << 20, 20, 3), (16 << 20, 6, 2), (None, 3, 1)]
    for limit, iters, warm in table:
        if limit is None or nbytes <= limit:
            return (max(2, iters // 4), 1) if quick else (iters, warm)
    raise AssertionError


def fastest(times: dict[str, float], builtin: str, margin: float) -> str:
    """The fastest of ``times``, unless ``builtin`` is within ``margin`` (relative) of it."""
    best = min(times, key=times.__getitem__)
    return builtin if times[builtin] <= (1 + margin) * times[best] else best


#: the columns of the shm allreduce's two transfers, and the option value of each
CMA_COLUMNS = {"shm:cma=never": 2**63 - 1, "shm:cma=0": 0}


def cma_threshold(measured: dict[int, dict[str, float]], margin: float,
                  smallest: int) -> int | None:
    """The shm allreduce's cross-memory attach threshold from the times of its two transfers
    (``measured``: bytes -> column -> us, the :data:`CMA_COLUMNS`) at the sizes above
    ``smallest`` (below it the call is replicated: no transfer to choose): the first size from
    which cross-memory attach is never slower by more than ``margin`` and is faster by more
    than it there (the geometric mean with the size before, as
    :func:`~collectives.selection.tuning_file.make_rules` puts thresholds); above any call when
    the slots win by more than ``margin`` at the largest size; None where neither does (the
    team's built-in threshold stays)."""
    sizes = sorted(s for s in measured if s > smallest)
    slots, cma = CMA_COLUMNS

    def verdict(size: int) -> str:
        t_slots, t_cma = measured[size][slots], measured[size][cma]
        return "cma" if t_cma * (1 + margin) < t_slots else \
            "slots" if t_slots * (1 + margin) < t_cma else "either"

    verdicts = [verdict(size) for size in sizes]
    for k, size in enumerate(sizes):
        if verdicts[k] == "cma" and "slots" not in verdicts[k:]:
            return size if k == 0 else int((size * sizes[k - 1]) ** 0.5)
    return CMA_COLUMNS[slots] if verdicts and verdicts[-1] == "slots" else None


def tune_world(sizes: Sequence[int], quick: bool = False, verbose: bool = True,
               margin: float = 0.05) -> dict:
    """Tune ``MPI.COMM_WORLD`` (collectively): the tuning-file entry for its size."""
    import numpy as np
    from mpi4py import MPI

    from ... import api
    from ...algorithms.auto import builtin_choice
    from ...algorithms.flat import FLAT
    from ...algorithms.shm import REPLICATE_BYTES
    from ..._runtime.nodes import node_ids, node_sizes
    from ..osu.timing import time_interleaved
    from ...options import Options
    from ...selection import tuning_file
    from .fit import fit_network, measure_pingpong, measure_reduction

    comm = MPI.COMM_WORLD
    opts = Options.from_env()
    nodes = node_sizes(comm, opts.node_size)
    names = ["native"] + [n for n in FLAT if n != "native"]
    one_node = len(nodes) == 1
    names.append("shm" if one_node else "hierarchical")
    measured: dict[str, dict[str, float]] = {}
    winners: dict[int, str] = {}
    for size in sizes:
        x = np.ones(max(size // 4, 1), np.float32)
        y = np.empty_like(x)
        calls = {n: (lambda n=n: api.allreduce(x, out=y, algorithm=n, comm=comm, options=opts))
                 for n in names}
        if one_node and comm.size > 1 and x.nbytes > REPLICATE_BYTES:
            for column, cma in CMA_COLUMNS.items():  # arrays of its own: a remembered call each
                given = replace(opts, shm_cma_bytes=cma)
                xs, ys = x.copy(), np.empty_like(y)
                calls[column] = lambda xs=xs, ys=ys, given=given: api.allreduce(
                    xs, out=ys, algorithm="shm", comm=comm, options=given)
        rounds = [time_interleaved(calls, *_iterations(x.nbytes, quick), comm)
                  for _ in range(ROUNDS)]
        row = {n: round(min(r[n].median for r in rounds), 3) for n in calls}
        measured[str(x.nbytes)] = row
        winners[x.nbytes] = fastest({n: row[n] for n in names},
                                    builtin_choice(x.nbytes, x.size, comm.size, one_node), margin)
        if verbose and comm.rank == 0:
            print(f"p={comm.size} {x.nbytes:>10} B: {winners[x.nbytes]:<18} " +
                  " ".join(f"{n}={t:.1f}" for n, t in row.items()), flush=True)
    model = None
    if comm.size >= 2:
        iters = 20 if quick else 100
        # rank 0's node holds ranks 0 .. nodes[0]-1 when ranks are placed node by node; find
        # a partner inside it and one outside it from the layout itself
        shared = node_ids(comm, opts.node_size)
        inside = [r for r in range(1, comm.size) if shared[r] == shared[0]]
        outside = [r for r in range(1, comm.size) if shared[r] != shared[0]]
        inter = measure_pingpong(comm, PINGPONG_SIZES, iters, outside[0]) if outside else None
        intra = measure_pingpong(comm, PINGPONG_SIZES, iters, inside[0]) if inside else inter
        reduction = measure_reduction(REDUCTION_SIZES)
        smallest = min(winners)
        net = fit_network(intra, reduction, (measured[str(smallest)]["native"] * 1e-6, comm.size),
                          inter_pingpong=inter, segment_bytes=opts.segment_bytes,
                          node_size=min(nodes) if len(nodes) > 1 else None)
        model = {k: v for k, v in asdict(net).items() if v is not None}
    entry = {"rules": tuning_file.make_rules(winners), "nodes": nodes, "measured_us": measured,
             "model": model}
    threshold = cma_threshold({int(size): row for size, row in measured.items()
                               if CMA_COLUMNS.keys() <= row.keys()}, margin, REPLICATE_BYTES)
    if threshold is not None:
        entry["shm_cma_bytes"] = threshold
        if verbose and comm.rank == 0:
            print(f"p={comm.size} shm: cross-memory attach from {threshold} B", flush=True)
    return entry


def tune_codecs(specs: Sequence[str], count: int, verbose: bool = True) -> dict:
    """Measure each codec spec on every rank of ``MPI.COMM_WORLD`` at once (collectively): the
    ``"codecs"`` entries, the slowest rank's seconds per byte, the same on every rank."""
    import numpy as np
    from mpi4py import MPI

    from ...compressed.speed import measure_speed

    comm = MPI.COMM_WORLD
    out = {}
    for spec in specs:
        comm.Barrier()
        speed = measure_speed(spec, count, comm.size)
        worst = np.empty(3)
        comm.Allreduce(np.array([speed.encode, speed.decode, speed.payload]), worst, op=MPI.MAX)
        out[spec] = {"encode": float(worst[0]), "decode": float(worst[1]),
                     "payload": float(worst[2]), "ranks": comm.size, "elements": count}
        if verbose and comm.rank == 0:
            print(f"p={comm.size} codec {spec}: encode {worst[0] * 1e9:.3f} ns/B, decode "
                  f"{worst[1] * 1e9:.3f} ns/B, payload {worst[2] * 1e9:.3f} ns/B", flush=True)
    return out


def _mpiexec() -> list[str]:
    try:
        return mpiexec_command()
    except FileNotFoundError as exc:
        raise SystemExit(f"collectives-tune: {exc}") from None


def _meta() -> dict:
    from mpi4py import MPI

    return {"host": platform.node(), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "mpi": MPI.Get_library_version().splitlines()[0].strip()}


def _worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    from ...selection import tuning_file

    entry = tune_world(args.sizes, args.quick, margin=args.margin)
    specs = [c for c in args.codec or DEFAULT_CODECS if c != "none"]
    codecs = tune_codecs(specs, args.codec_elements // (4 if args.quick else 1))
    comm = MPI.COMM_WORLD
    if comm.rank != 0:
        return
    if args.partial:
        Path(args.partial).write_text(json.dumps({"p": comm.size, "entry": entry,
                                                  "codecs": codecs}))
        return
    path = tuning_file.write(args.output, {comm.size: entry}, codecs=codecs, **_meta())
    print(f"wrote {path} (world size {comm.size})")


def _launch(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from ...selection import tuning_file

    entries, codecs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for p in args.ranks:
            partial = Path(tmp) / f"p{p}.json"
            cmd = [*_mpiexec(), "-n", str(p), sys.executable, "-m", "collectives.tools.tuning.tune",
                   "--worker", "--partial", str(partial), *argv]
            print(f"# {' '.join(cmd[:3])} ... ({p} ranks)", flush=True)
            subprocess.run(cmd, check=True, timeout=args.timeout)
            done = json.loads(partial.read_text())
            entries[p] = done["entry"]
            codecs.update(done.get("codecs") or {})
    path = tuning_file.write(args.output, entries, codecs=codecs, **_meta())
    print(f"wrote {path} (world sizes {', '.join(map(str, entries))})")


def _parser() -> argparse.ArgumentParser:
    from ..osu.options import parse_sizes
    from ...selection.tuning_file import default_path, tuning_path

    p = argparse.ArgumentParser(prog="collectives-tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=lambda s: [int(v) for v in s.split(",")], default=[2, 4, 8],
                   help="world sizes to tune when not started under mpiexec (default 2,4,8)")
    p.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES,
                   help="message sizes in bytes (default 8,64,512,4K,32K,256K,1M,4M,16M,64M)")
    p.add_argument("-o", "--output", type=Path, default=tuning_path() or default_path(),
                   help="tuning file to write or merge into (default: where auto looks)")
    p.add_argument("--quick", action="store_true", help="a quarter of the iterations")
    p.add_argument("--margin", type=float, default=0.05,
                   help="keep auto's built-in choice unless beaten by more than this (0.05)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per world size")
    p.add_argument("--codec", action="append", metavar="SPEC",
                   help="a codec spec whose pipeline speed to measure for codec='auto:SPEC' "
                        "(repeat it; default " + ", ".join(DEFAULT_CODECS) + "; 'none': none)")
    p.add_argument("--codec-elements", type=int, default=4 << 20,
                   help="float32 elements the codecs are measured on (default 4 Mi; --quick: "
                        "a quarter)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--partial", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``collectives-tune``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.worker or any(v in os.environ for v in LAUNCHER_ENV):
        _worker(args)
    else:
        forwarded = [a for a in argv if a not in ("--worker",)]
        _launch(args, _strip_ranks(forwarded))


def _strip_ranks(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--ranks":
            skip = True
        elif not a.startswith("--ranks="):
            out.append(a)
    return out


#: Console script ``collectives-tune``: an error on any rank ends the job
#: (``_runtime.cli.program``).
script = program("collectives-tune", main)

if __name__ == "__main__":
    sys.exit(script())
