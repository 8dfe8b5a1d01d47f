"""PowerSGD's per-step work on one rank against the two matrix products it cannot avoid.

A PowerSGD step (``compress.PowerSGD``, warm start, per layer) computes ``P = M Q``, orthogonalises
``P`` (reduced QR of a rows x r matrix), computes ``Q = M^T P_hat``, and rebuilds ``P_hat Q^T``
(the aggregate, and error feedback's residual). The two products ``M Q`` and ``M^T P`` read the
whole matrix twice and are the floor: nothing that multiplies by M costs less. This times, per
layer shape and rank, interleaved in one process:

``matmuls``      ``M @ Q`` and ``M.T @ P`` in NumPy (the floor);
``encode path``  the codec's own ``compute_p``, ``orthogonalize``, ``compute_q`` (what each rank
                 runs between the two allreduces of the summable strategy, warm start kept);
``+ rebuild``    the same plus ``reconstruct`` (``P_hat Q^T``, written once) and error
                 feedback's compensation and residual (``ErrorFeedback.compensate`` /
                 ``remember``): the whole local step of ``compressed_allreduce``.

Medians of ``--repeats`` calls each, after one untimed call, and their ratio to the matmuls'.

    python bench/powersgd_speed.py --shapes 4096x4096,1024x4096,4096x1024 --ranks 1,4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

import compress


def _median(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(rows: int, cols: int, rank: int, repeats: int) -> dict:
    """The three timings (seconds) for one ``rows x cols`` float32 layer at ``rank``."""
    rng = np.random.default_rng(0)
    m = rng.standard_normal((rows, cols)).astype(np.float32)
    q0 = rng.standard_normal((cols, rank)).astype(np.float32)
    p0 = rng.standard_normal((rows, rank)).astype(np.float32)
    codec = compress.get("powersgd", rank=rank, seed=0)
    ef = compress.ErrorFeedback(compress.get("powersgd", rank=rank, seed=0))

    def matmuls():
        m @ q0
        m.T @ p0

    def encode_path():
        codec.compute_q(m, codec.orthogonalize(codec.compute_p(m, key="w")))

    def whole_step():
        c = ef.compensate(m, key="w")
        p_hat = ef.codec.orthogonalize(ef.codec.compute_p(c, key="w"))
        q = ef.codec.compute_q(c, p_hat)
        y = ef.codec.reconstruct(p_hat, q, key="w", shape=m.shape, dtype=m.dtype)
        ef.remember(c, y, key="w")

    base = _median(matmuls, repeats)
    enc = _median(encode_path, repeats)
    step = _median(whole_step, repeats)
    return {"rows": rows, "cols": cols, "rank": rank, "matmuls_s": base, "encode_s": enc,
            "step_s": step, "encode_x": enc / base, "step_x": step / base}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="4096x4096,1024x4096,4096x1024",
                    help="comma-separated ROWSxCOLS (default %(default)s)")
    ap.add_argument("--ranks", default="1,2,4", help="PowerSGD ranks (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in a.shapes.split(",")]
    ranks = [int(r) for r in a.ranks.split(",")]
    print(f"# PowerSGD local step against its two matrix products (float32, median of "
          f"{a.repeats}); load {' '.join(f'{v:.1f}' for v in _load())}")
    print(f"# {'shape':>11} {'r':>3} {'matmuls ms':>11} {'encode ms':>10} {'x':>6} "
          f"{'step ms':>9} {'x':>6}")
    rows = []
    for (r_, c_) in shapes:
        for rank in ranks:
            row = measure(r_, c_, rank, a.repeats)
            rows.append(row)
            print(f"  {r_:>5}x{c_:<5} {rank:>3} {1e3 * row['matmuls_s']:>11.2f} "
                  f"{1e3 * row['encode_s']:>10.2f} {row['encode_x']:>6.2f} "
                  f"{1e3 * row['step_s']:>9.2f} {row['step_x']:>6.2f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": platform.node(), "load": _load(), "rows": rows}, f, indent=1)
    return 0


def _load() -> tuple[float, ...]:
    try:
        return os.getloadavg()
    except OSError:
        return ()


if __name__ == "__main__":
    raise SystemExit(main())
