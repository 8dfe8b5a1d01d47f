"""The driver's data-parallel exchange, piece by piece, against the planner's dp term.

Usage (under the launch the planner's sweep uses; docs/planner.md, "ZeRO 1 and fp16")::

    python bench/cluster.py run --name hplan41 --hosts 4 --ranks-per-host 1 --rate 10gbit -- \\
        python bench/plan_dp_terms.py --mesh 2,1,2 --calibration cal.json --json out.json

Every rank builds its stage's gradient and parameter buffers of ``--model`` on the mesh
``dp,pp,tp`` (:func:`collectives.sgd.pipelined.stage_shapes`) and runs, all ranks at once, a
barrier before each call, ``--repeats`` times after one untimed call (the slowest rank's
median):

- ``dense``: the driver's ``--sync sync`` exchange (one ring allreduce of the gradient over dp);
- ``zero1``: ``--shard 1``'s exchange (:class:`collectives.sgd.sync.Sharded`: one in-place
  reduce-scatter of the whole gradient) and its ``average_params`` (the parameters' allgather,
  in place), beside one reduce-scatter and one allgather out of place (each through a copy);
- ``fp16``: ``--codec fp16``'s exchange (``compressed_allreduce``, summable) and its pieces:
  the ``x / p`` scaling, the encode, the ring allreduce of the float16 payload, the same
  bytes as float32, the decode;
- the optimizer step over the stage's parameters and over a dp shard of them.

With ``--calibration FILE`` (``python -m collectives.plan --calibrate``) rank 0 also prints
what the planner prices for each (its dp term and update), from that file's links and codec
speeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import collectives  # noqa: E402
from collectives.compressed import CompressionState  # noqa: E402
from collectives.mesh.mesh import Mesh  # noqa: E402
from collectives.sgd.driver import limit_threads  # noqa: E402
from collectives.sgd.fusion import FusionBuffer  # noqa: E402
from collectives.sgd.model import MODELS  # noqa: E402
from collectives.sgd.optim import SGD  # noqa: E402
from collectives.sgd.pipelined import MESH_AXES, stage_bounds, stage_shapes  # noqa: E402
from collectives.sgd.sync import Sharded, Synchronous  # noqa: E402
from collectives.sgd.timing import Clock  # noqa: E402


def _timed(comm, fn, repeats: int, before=None) -> float:
    """The slowest rank's median seconds of ``fn`` (``before`` untimed before each call)."""
    if before:
        before()
    fn()
    times = []
    for _ in range(repeats):
        if before:
            before()
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return comm.allreduce(statistics.median(times), op=MPI.MAX)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="deep")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--mesh", default="2,1,2", help="dp,pp,tp")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calibration")
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--rate")
    ap.add_argument("--json")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    dp, pp, tp = (int(x) for x in a.mesh.split(","))
    limit_threads(comm.size)
    sizes = (a.features, *MODELS[a.model], a.classes)
    mesh = Mesh((dp, pp, tp), names=MESH_AXES, comm=comm)
    _, s, _ = mesh.coords()
    bounds = stage_bounds(sizes, pp, None)
    shapes = stage_shapes(sizes, bounds[s], bounds[s + 1], tp)
    dpc = mesh.comm("dp")
    rng = np.random.default_rng(comm.rank)
    grads, params = FusionBuffer(shapes), FusionBuffer(shapes)
    fresh = rng.standard_normal(grads.size).astype(np.float32)
    params.flat[...] = rng.standard_normal(params.size).astype(np.float32)

    def refill():
        grads.flat[...] = fresh

    n = grads.size
    out: dict[str, float] = {}
    R = a.repeats
    dense = Synchronous(grads, params, dpc, Clock())
    out["dense exchange"] = _timed(comm, lambda: dense(0), R, refill)

    zero = Sharded(grads, params, dpc, Clock(), stage=1)
    out["zero1 reduce (reduce_all)"] = _timed(comm, lambda: zero(0), R, refill)
    out["zero1 allgather (average_params)"] = _timed(comm, lambda: zero.average_params(0), R)
    z = zero.zero
    whole = np.empty(z.plan.counts[dpc.rank], np.float32)
    out["reduce_scatter whole"] = _timed(
        comm, lambda: collectives.reduce_scatter(grads.flat, out=whole, op="avg",
                                                 counts=z.plan.counts, algorithm="ring",
                                                 comm=dpc), R, refill)
    own = params.flat[z.mine].copy()
    out["allgather whole"] = _timed(
        comm, lambda: collectives.allgather(own, out=params.flat, counts=z.plan.counts,
                                            algorithm="ring", comm=dpc), R)

    state = CompressionState.from_spec("fp16", seed=0, rank=comm.rank)
    clock = Clock()
    fp16 = Synchronous(grads, params, dpc, clock, state=state)
    out["fp16 exchange"] = _timed(comm, lambda: fp16(0), R, refill)
    codec = state.codec
    scaled = grads.flat / dp
    out["fp16 scale x/p"] = _timed(comm, lambda: grads.flat / dp, R)
    out["fp16 encode"] = _timed(comm, lambda: codec.summable_encode(scaled, key="g", step=0), R)
    rep = codec.summable_encode(scaled, key="g", step=0)
    half = rep.copy()
    out["ring allreduce float16 payload"] = _timed(
        comm, lambda: collectives.allreduce(half, out=half, algorithm="ring", comm=dpc), R,
        lambda: half.__setitem__(slice(None), rep))
    f32 = np.ones(rep.nbytes // 4, np.float32)
    out["ring allreduce float32 same bytes"] = _timed(
        comm, lambda: collectives.allreduce(f32, out=f32, algorithm="ring", comm=dpc), R)
    dst = np.empty(n, np.float32)
    out["fp16 decode"] = _timed(
        comm, lambda: codec.summable_decode(rep, shape=(n,), dtype=np.float32, out=dst), R)
    opt = SGD(params.flat, 0.9)
    out["update full"] = _timed(comm, lambda: opt.step(grads.flat, 1e-3), R)
    opt_s = SGD(params.flat[: n // dp], 0.9)
    out["update shard"] = _timed(comm, lambda: opt_s.step(grads.flat[: n // dp], 1e-3), R)

    if comm.rank == 0:
        print(f"mesh dp {dp} pp {pp} tp {tp}: {n} parameters on a rank ({4 * n / 2**20:.1f} MiB)")
        for k, v in out.items():
            print(f"  {k:36s} {v * 1e3:9.2f} ms" if "count" not in k else f"  {k:36s} {v}")
        if a.json:
            Path(a.json).write_text(json.dumps({"mesh": [dp, pp, tp], "params": n,
                                                "seconds": out}, indent=1))
        if a.calibration:
            _model(a, n, dp, pp, tp, comm.size)
    mesh.free()
    return 0


def _model(a, n: int, dp: int, pp: int, tp: int, ranks: int) -> None:
    """The planner's pieces for the same exchange from the calibration file."""
    from collectives.parallel import planner
    from collectives.parallel.planner.network import axis_groups, group_network
    from collectives.parallel.planner.predict import codec_speed
    from collectives.selection.cost_model import predict as cost

    compute = planner.MeasuredCompute(a.calibration)
    cl = planner.cluster(ranks, a.hosts, a.rate, measured=compute.network)
    net = group_network(cl, axis_groups("dp", dp, pp, tp))
    nb = 4.0 * n
    print("the planner's pieces (calibration file):")
    print(f"  ring allreduce n               {cost('ring', nb, dp, net) * 1e3:9.2f} ms")
    print(f"  ring allreduce n/2             {cost('ring', nb / 2, dp, net) * 1e3:9.2f} ms")
    sp = codec_speed("fp16", None, compute.codec_speeds())
    print(f"  fp16 (e + d) n                 {(sp.encode + sp.decode) * nb * 1e3:9.2f} ms "
          f"(e {sp.encode * 1e9:.3f}, d {sp.decode * 1e9:.3f} ns/B)")
    print(f"  update full / shard            {compute.update(n) * 1e3:9.2f} / "
          f"{compute.update(n // dp) * 1e3:.2f} ms")
    print(f"  net {net}")


if __name__ == "__main__":
    sys.exit(main())
