"""What one rank's stage-2 step costs in CPU, piece by piece, in one process on one core.

Run ``python bench/sharded_codec_cost.py [--world 4] [--repeats 7] [--json FILE]``. The step of
``python -m collectives.sgd --model wide --shard 2 --codec topk:ratio=0.01 --error-feedback
--param-codec bf16`` at ``--world`` ranks, without the network, each piece timed on its own
(one BLAS thread, as the driver gives each rank on a 2-core machine with 2 ranks per core; the
median of ``--repeats``, the pieces interleaved, after one untimed call of each; two gradients
used in turn, so that error feedback keeps mixing new values in):

``compute``          forward and backward of the wide MLP on a batch of 32 (the driver's
                     ``MLP.loss_and_grad``, the whole gradient at once) and momentum SGD on one
                     shard (``SGD.step_range``);
``top-k + EF``       ``compress.ErrorFeedback(TopK(0.01)).encode`` of every destination block of
                     every bucket of the per-bucket plan (the stage-2 default: the 4096 x 4096
                     layer in ``--buckets`` balanced buckets, each cut into one block per rank;
                     the two small layers one bucket each), each under its own key;
``sparse sum``       ``TensorCoding.aggregate_into`` of the ``--world`` payloads of this rank's
                     block of every bucket (the reduce-scatter's receiving side);
``bf16 encode``      the bf16 codec's encode of this rank's shard (the parameters' allgather);
``bf16 decode``      its decode of every rank's payload into the replica, as
                     ``compressed_allgather`` does it (``decode(..., out=)``);
``... copied``       the same into a new array each, then copied into the replica (what
                     ``compressed_allgather`` did before ``out=``);
``copy``             ``np.copyto`` of the whole parameter vector: the memory yardstick.

The wide model's layers are 64 -> 4096 -> 4096 -> 10 (``--dataset synthetic``): 17.09 M
parameters. docs/sharded.md ("Fourth pass") turns these into the step's CPU bound.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from collectives.compressed import CompressionState
from collectives.compressed.coding import TensorCoding
from collectives.sgd.driver import limit_threads
from collectives.sgd.model import MLP
from collectives.sgd.optim import SGD

SIZES = (64, 4096, 4096, 10)


def _medians_ms(rows: dict, repeats: int) -> dict:
    """Each row's median time, the rows interleaved (row 1, row 2, ..., row 1, ...: a loaded
    machine's drift hits them alike), after one untimed call of each."""
    for fn in rows.values():
        fn()  # untimed: compilation, first-touch of buffers
    times: dict = {k: [] for k in rows}
    for _ in range(repeats):
        for k, fn in rows.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def _blocks(world: int, buckets: int) -> list[list[int]]:
    """Per bucket, the element count of each destination block (one per rank)."""
    big = SIZES[1] * SIZES[2] + SIZES[2]
    small = [SIZES[0] * SIZES[1] + SIZES[1], SIZES[2] * SIZES[3] + SIZES[3]]
    plan = [small[0]] + [big // buckets + (b < big % buckets) for b in range(buckets)] + [small[1]]
    return [[n // world + (r < n % world) for r in range(world)] for n in plan]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--buckets", type=int, default=5,
                    help="buckets of the 4096 x 4096 layer (the per-bucket plan at 4 ranks: 5)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json")
    a = ap.parse_args()
    limit_threads(2)  # one BLAS thread on this 2-core machine
    rng = np.random.default_rng(0)
    p = a.world

    model = MLP(SIZES, seed=0)
    n = model.params.size
    x = rng.standard_normal((32, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], 32)
    shard = n // p
    opt = SGD(model.params.flat[:shard].copy(), 0.9, 0.0)

    def compute() -> None:
        model.loss_and_grad(x, y)
        opt.step_range(0, shard, model.grads.flat[:shard], 0.01)

    blocks = _blocks(p, a.buckets)
    # two gradients, used in turn, so that the residual keeps mixing new values in
    grads = [[[rng.standard_normal(c, dtype=np.float32) for c in bucket] for bucket in blocks]
             for _ in range(2)]

    state = CompressionState.from_spec("topk:ratio=0.01", error_feedback=True)
    codings = [TensorCoding(state, f"grads.{b}", 0, True, p) for b in range(len(blocks))]
    turn = [0]

    def topk_ef() -> list:
        turn[0] ^= 1
        return [[c.encode(g, part=i) for i, g in enumerate(bucket)]
                for c, bucket in zip(codings, grads[turn[0]])]

    coding = TensorCoding(CompressionState.from_spec("topk:ratio=0.01"), "grads", 0, True, p)
    payloads = topk_ef()
    outs = [np.empty(bucket[0], dtype=np.float32) for bucket in blocks]

    def sparse_sum() -> None:
        for bucket, out in zip(payloads, outs):
            coding.aggregate_into([bucket[0]] * p, out.size, out)

    bf16 = CompressionState.from_spec("bf16")
    pcoding = TensorCoding(bf16, "params", 0, False, p, (shard,))
    mine = model.params.flat[:shard].copy()
    replica = np.empty(shard * p, dtype=np.float32)
    payload = pcoding.encode(mine)

    def bf16_decode() -> None:
        for k in range(p):  # as compressed_allgather does: into the replica
            pcoding.decode(payload, shard, out=replica[k * shard:(k + 1) * shard])

    def bf16_decode_copy() -> None:
        for k in range(p):  # as it did before 2026-12-07's fourth pass: a new array, copied
            replica[k * shard:(k + 1) * shard] = pcoding.decode(payload, shard)

    whole = np.empty(n, dtype=np.float32)
    rows = {
        "compute": compute,
        "top-k + EF": topk_ef,
        "sparse sum": sparse_sum,
        "bf16 encode": lambda: pcoding.encode(mine),
        "bf16 decode": bf16_decode,
        "bf16 decode, copied": bf16_decode_copy,
        "copy": lambda: np.copyto(whole, model.params.flat),
    }
    res = _medians_ms(rows, a.repeats)
    for k, v in res.items():
        print(f"{k:14s} {v:8.1f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"world": p, "params": n, "blocks": blocks, "ms": res}, f, indent=1)


if __name__ == "__main__":
    main()
