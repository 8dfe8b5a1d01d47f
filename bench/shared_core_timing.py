"""One layer's kernels timed one call at a time and as a rate, by processes sharing the cores.

Why ``python -m collectives.plan --calibrate`` times its kernels as rates (docs/planner.md,
"Results with the kernels timed as rates"): with more busy processes than cores the scheduler
gives each a slice of a few milliseconds, so a call shorter than a slice often runs at the
speed of a process alone, while over a whole training step each gets only its share of the
core. Every process here starts at once (a barrier), times the planner's own layer kernels
(``measure_layer``: the SGD driver's forward and backward of one Linear+ReLU) both ways, one
BLAS thread each, and prints one line::

    python bench/shared_core_timing.py --processes 4 --shape 32,1024,512
    python bench/shared_core_timing.py --processes 1 --shape 32,1024,512   # alone
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics


def _time(barrier, shape, repetitions, window, out):
    from threadpoolctl import threadpool_limits

    from collectives.parallel.planner.compute import measure_layer

    rows, fan_in, fan_out = shape
    with threadpool_limits(1):
        measure_layer(rows, fan_in, fan_out, True, True, 1)  # first touch, BLAS set up
        barrier.wait()
        single = measure_layer(rows, fan_in, fan_out, True, True, repetitions)
        barrier.wait()
        rate = measure_layer(rows, fan_in, fan_out, True, True, repetitions, window)
    out.put((single, rate))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--shape", default="32,1024,512", help="rows,fan_in,fan_out")
    ap.add_argument("--repetitions", type=int, default=7)
    ap.add_argument("--window", type=float, default=0.025, help="seconds per timed rate")
    a = ap.parse_args(argv)
    shape = tuple(int(x) for x in a.shape.split(","))
    if len(shape) != 3 or min(shape) < 1 or a.processes < 1 or a.window <= 0:
        ap.error("--shape takes three positive integers; --processes and --window above 0")
    barrier, out = mp.Barrier(a.processes), mp.Queue()
    procs = [mp.Process(target=_time, args=(barrier, shape, a.repetitions, a.window, out))
             for _ in range(a.processes)]
    for p in procs:
        p.start()
    got = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    ms = lambda xs: ", ".join(f"{x * 1e3:.3f}" for x in sorted(xs))  # noqa: E731
    for i, name in enumerate(("forward", "backward")):
        single = [g[0][i] for g in got]
        rate = [g[1][i] for g in got]
        print(f"{name} {a.shape}, {a.processes} process(es) on {mp.cpu_count()} cores: "
              f"one call (median of {a.repetitions}) {ms(single)} ms; rate over "
              f"{a.window * 1e3:.0f} ms {ms(rate)} ms; median rate / median call "
              f"{statistics.median(rate) / statistics.median(single):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
