"""The per-step codec pipeline, phase by phase, against a memory copy of the dense vector.

One training step of a compressed allreduce does, per tensor: error feedback and encode (the
memory's ``encode``), and, on every rank, decode and aggregate of the p payloads. For each codec
and size this times, in one process, each phase against ``np.copyto`` of the dense vector (float32;
the inputs are independent draws of ``np.random.default_rng(0).standard_normal``, one per step
in turn and one per rank, the first of which ``x`` is copied and encoded), measured in the same
run:

``copy``          ``np.copyto(out, x)``: the yardstick (read n, write n);
``encode``        ``codec.encode(x)`` alone (into a reused payload buffer where the size is fixed);
``decode``        ``codec.decode(payload)`` into a new dense array;
``ef``            ``compress.ErrorFeedback(codec).encode(x)`` at its steady state (residual kept,
                  payload buffer reused): the fused path for top-k, DGC, threshold, random-k;
``ef unfused``    the same with ``fused=False``: compensate, encode, update from the payload;
``dgc memory``    ``compress.DGCMemory`` (dgc only), fused and unfused;
``aggregate``     ``TensorCoding.aggregate_into`` of ``--ranks`` payloads (of different inputs) into
                  the result, with the mean, as the allgather strategy does (sparse payloads are
                  added at their indices);
``agg dense``     the same by decoding every payload and adding the dense vectors (the way it
                  was done before: p dense decodes).

Every phase is timed interleaved with the copy (copy, phase, copy, phase, ...: a loaded machine's
drift hits both alike), ``--repeats`` times each after one untimed call; ``ms`` is the phase's
median, ``x copy`` its median over the median of the copies interleaved with it.

    python bench/codec_pipeline.py --sizes 17.1M --repeats 11 --json pipeline.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import compress
from collectives.compressed.coding import TensorCoding
from collectives.compressed.state import CompressionState

DEFAULT_CODECS = ["topk:ratio=0.01", "topk:ratio=0.001", "dgc:density=0.001,seed=0",
                  "threshold:tau=3.0", "randomk:ratio=0.01,seed=0"]
#: codecs whose payload size depends on the data (no reused ``out=`` buffer)
_VARIABLE = ("threshold", "dgc")


def parse_size(text: str) -> int:
    """``17.1M``, ``64M``, ``4096``, ``1K`` -> elements (K, M, G are powers of ten)."""
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:], 1)
    return int(round(float(text[:-1] if scale > 1 else text) * scale))


def timed(fn, copy, repeats: int) -> tuple[float, float]:
    """Median seconds of ``fn()`` and of ``copy()``, called alternately ``repeats`` times each
    after one untimed call of each."""
    fn()
    copy()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for f, into in ((copy, times[1]), (fn, times[0])):
            t = time.perf_counter()
            f()
            into.append(time.perf_counter() - t)
    return statistics.median(times[0]), statistics.median(times[1])


class Steps:
    """Calls of a memory's ``encode`` on one key, a new step each time (its steady state), on
    the inputs ``xs`` in turn (independent gradients: the same one every step would pile up
    in the residual)."""

    def __init__(self, memory, xs, out):
        self.memory, self.xs, self.out, self.step = memory, xs, out, 0

    def __call__(self):
        self.step += 1
        kw = {} if self.out is None else {"out": self.out}
        return self.memory.encode(self.xs[self.step % len(self.xs)], key="w", step=self.step,
                                  **kw)


def phases(spec: str, xs: list[np.ndarray], copy, ranks: int,
           repeats: int) -> dict[str, tuple[float, float]]:
    """``{phase: (median seconds, median seconds of the copies interleaved)}`` of every phase of
    the module docstring for the codec ``spec``; ``xs``: independent inputs (at least
    ``ranks``), ``xs[0]`` the one encoded and copied."""
    x = xs[0]
    codec = compress.from_spec(spec)
    fixed = codec.name not in _VARIABLE
    payload = codec.encode(x, key="w", step=0)
    out = payload.copy() if fixed else None
    t = {"encode": timed(lambda: codec.encode(x, key="w", step=0, out=out), copy, repeats),
         "decode": timed(lambda: codec.decode(payload), copy, repeats)}
    for label, fused in (("ef", True), ("ef unfused", False)):
        memory = compress.ErrorFeedback(compress.from_spec(spec), fused=fused)
        t[label] = timed(Steps(memory, xs, None if out is None else out.copy()), copy, repeats)
    if codec.name == "dgc":
        for label, fused in (("dgc memory", True), ("dgc memory unfused", False)):
            memory = compress.DGCMemory(compress.from_spec(spec), fused=fused)
            t[label] = timed(Steps(memory, xs, None), copy, repeats)
    payloads = [codec.encode(xs[r], key="w", step=0) for r in range(ranks)]
    coding = TensorCoding(CompressionState(compress.from_spec(spec)), "w", 0, True, ranks,
                          x.shape)
    result = np.empty_like(x)
    t["aggregate"] = timed(lambda: coding.aggregate_into(payloads, x.size, result), copy,
                           repeats)

    def dense():
        acc = codec.decode(payloads[0], count=x.size).astype(np.float32, copy=True)
        for pl in payloads[1:]:
            acc += codec.decode(pl, count=x.size)
        acc /= ranks
        result[...] = acc

    t["agg dense"] = timed(dense, copy, repeats)
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,4M,17.1M,64M",
                    help="comma-separated element counts (K, M = 1e3, 1e6; default 1M,4M,17.1M,64M)")
    ap.add_argument("--codecs", default=";".join(DEFAULT_CODECS),
                    help="semicolon-separated codec specs NAME[:k=v,...] (default: %(default)s)")
    ap.add_argument("--ranks", type=int, default=4, help="payloads aggregated (default 4)")
    ap.add_argument("--repeats", type=int, default=11, help="timed calls; the median is reported")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    specs = [s for s in args.codecs.split(";") if s]
    results = {"repeats": args.repeats, "ranks": args.ranks, "numpy": np.__version__,
               "machine": platform.processor() or platform.machine(), "sizes": []}
    print(f"# codec pipeline: each phase against np.copyto of the dense float32 vector, "
          f"median of {args.repeats}")
    for n in sizes:
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal(n, dtype=np.float32) for _ in range(max(3, args.ranks))]
        x = xs[0]
        dst = np.empty_like(x)
        copy = lambda: np.copyto(dst, x)  # noqa: E731
        copy_s = timed(copy, copy, args.repeats)[0]
        row = {"n": n, "copy_ms": copy_s * 1e3, "codecs": {}}
        print(f"\n# n = {n} ({x.nbytes / 1e6:.1f} MB), copy {copy_s * 1e3:.2f} ms")
        print(f"{'# codec':<28}{'phase':<20}{'ms':>10}{'copy ms':>10}{'x copy':>10}")
        for spec in specs:
            t = phases(spec, xs, copy, args.ranks, args.repeats)
            row["codecs"][spec] = {phase: {"ms": s * 1e3, "copy_ms": c * 1e3, "x_copy": s / c}
                                   for phase, (s, c) in t.items()}
            for phase, (s, c) in t.items():
                print(f"{spec:<28}{phase:<20}{s * 1e3:>10.2f}{c * 1e3:>10.2f}{s / c:>10.2f}")
        results["sizes"].append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    import sys

    from collectives.tools import program

    sys.exit(program("codec_pipeline", main)())
