"""Per-call overhead of the collectives against a bare ``comm.Allreduce``, side by side.

``mpiexec -n 2 python bench/call_overhead.py [--bytes 8] [--calls 20000] [--rounds 7]``

In every round each variant makes ``--calls`` back-to-back calls on the same ``--bytes`` of
float32 (sum, out of place), timed as a whole; variants take turns within the round, so load on
a shared machine hits them alike. Reported: the median over rounds of the time per call (rank
0's; the ranks are in lock step) and its ratio to the bare call's median.

- ``bare``: ``comm.Allreduce(x, y, op=MPI.SUM)`` of mpi4py on a duplicate of COMM_WORLD;
- ``plan()``: a persistent plan (``collectives.allreduce_init``) called as ``plan()``;
- ``allreduce``: the blocking ``collectives.allreduce(x, out=y)``;
- ``allreduce(options=)``: the same with ``options=`` given, so that the call does not read the
  ``COLLECTIVES_*`` environment variables (``Options.from_env``): ``allreduce`` minus this is
  what reading them costs per call;
- ``validate=True`` (``--validate``): ``allreduce`` with its cross-rank argument check;
- ``unguarded`` (``--unguarded``): the same call's algorithm run outside the failure guard
  (``collectives._runtime.guard``: call numbering, notice-aware waits, exact receive sizes; the
  communicator's context from ``collectives.diagnostics.probe``, which exists for this), i.e.
  what ``allreduce`` did per call before it; ``allreduce`` / ``unguarded`` is the guard's cost;
- ``lane, unguarded`` (``--lane``): what a repeat of the call runs, its algorithm's lane
  (``algorithms/lanes.py``), called directly: no guard, no checks, the algorithm alone;
- ``no recorder`` (``--recorder``): ``allreduce`` on a second duplicate of COMM_WORLD made
  with the flight recorder off (``COLLECTIVES_FLIGHT_RECORDER=0`` while its first call makes
  its guard; docs/debugging.md); ``allreduce`` / ``no recorder`` is the recorder's cost,
  measured in one process, turn by turn;
- ``allreduce(abort)``, ``plan(abort)`` (``--abort``): the same calls with
  ``Options(on_error="abort")``: plain blocking MPI, an error ends the job
  (``collectives._runtime.abort_mode``);
- ``iallreduce+wait``: ``collectives.iallreduce(x, out=y).wait()`` (at most 4 KiB: run by its
  ``wait()`` on this thread; larger: a hand-off to the engine's thread and back, the latency of
  a non-blocking call, not its cost to overlapped work);
- ``python wrapper``, ``python wrapper+checks`` (``--floor``): the floor any Python API over MPI
  pays: a Python function with ``allreduce``'s keyword arguments that only calls the bare
  ``comm.Allreduce``, and the same after four checks of its arguments (type, dtype, shape, write
  flag), the least a call that rejects bad input must do; and ``mpi Iallreduce+Wait``, the bare
  ``comm.Iallreduce(x, y).Wait()``, the floor of a call that must not block in MPI (the failure
  guard's native calls);
- ``iallreduce() half``, ``.wait() half`` (``--split``): ``iallreduce+wait`` again, each half
  timed apart (``time.perf_counter_ns`` around it, which adds its own cost to both): what
  submitting costs (a small operation only makes and orders its request here) and what its
  ``wait()`` costs (it runs the operation); the variant's own row is the whole call;
- ``timeline on`` (``--timeline``): ``allreduce`` while a timeline records (``collectives.timeline``;
  its observers are registered for this variant's calls only, so every other variant runs with
  it off, as without ``--timeline``). Also printed: the spans each call records and
  (``timeline on`` - ``allreduce``) / spans, the cost of one span.

``--json FILE`` writes the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from mpi4py import MPI

import collectives


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--calls", type=int, default=20000, help="calls per variant and round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--algorithm", default="auto", help="for plan() and allreduce")
    ap.add_argument("--no-iallreduce", action="store_true", help="skip iallreduce+wait")
    ap.add_argument("--validate", action="store_true",
                    help="add allreduce with validate=True (its cross-rank check)")
    ap.add_argument("--unguarded", action="store_true",
                    help="add the allreduce's algorithm run outside the failure guard")
    ap.add_argument("--lane", action="store_true",
                    help="add the call's lane (what a repeat runs) called with no guard")
    ap.add_argument("--recorder", action="store_true",
                    help="add allreduce with the flight recorder off (its cost)")
    ap.add_argument("--abort", action="store_true",
                    help='add allreduce and plan() with Options(on_error="abort")')
    ap.add_argument("--timeline", action="store_true",
                    help="add allreduce with a timeline recording, and the cost per span")
    ap.add_argument("--floor", action="store_true",
                    help="add a bare Python wrapper of comm.Allreduce, without and with checks, "
                         "and the bare comm.Iallreduce(...).Wait()")
    ap.add_argument("--split", action="store_true",
                    help="add iallreduce+wait with its two halves timed apart")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    bare_comm = comm.Dup()
    x = np.ones(max(1, args.bytes // 4), dtype=np.float32)
    y = np.empty_like(x)
    plan = collectives.allreduce_init(x, out=y, algorithm=args.algorithm)
    opts = collectives.Options.from_env()
    variants = {
        "bare": lambda: bare_comm.Allreduce(x, y, op=MPI.SUM),
        "plan()": plan,
        "allreduce": lambda: collectives.allreduce(x, out=y, algorithm=args.algorithm),
        "allreduce(options=)":
            lambda: collectives.allreduce(x, out=y, algorithm=args.algorithm, options=opts),
    }
    if args.floor:
        def wrapper(x, *, out=None, op="sum", algorithm="auto", comm=None, options=None):
            bare_comm.Allreduce(x, out, op=MPI.SUM)
            return out

        def checked(x, *, out=None, op="sum", algorithm="auto", comm=None, options=None):
            if (type(x) is not np.ndarray or out.dtype is not x.dtype or out.shape != x.shape
                    or not out.flags.writeable):
                raise TypeError("bad arguments")
            bare_comm.Allreduce(x, out, op=MPI.SUM)
            return out

        variants["python wrapper"] = lambda: wrapper(x, out=y)
        variants["python wrapper+checks"] = lambda: checked(x, out=y)
        variants["mpi Iallreduce+Wait"] = lambda: bare_comm.Iallreduce(x, y, op=MPI.SUM).Wait()
    if args.validate:
        variants["validate=True"] = \
            lambda: collectives.allreduce(x, out=y, algorithm=args.algorithm, validate=True)
    if args.unguarded or args.lane:  # the checked call and its decided algorithm, unguarded
        from collectives.algorithms import lanes
        from collectives.api import AllreduceCall, run_allreduce
        from collectives.diagnostics.probe import context

        ctx = context(comm)
        call = AllreduceCall(comm, x, y, "sum", args.algorithm, collectives.Options.from_env())
        fn = call.decide(ctx)
    if args.unguarded:
        variants["unguarded"] = lambda: run_allreduce(call.src, call.dst, call.op, fn, ctx,
                                                      call.opts)
    if args.lane:
        lane = lanes.lane(fn, call.src, call.dst, call.op, ctx, call.opts)
        variants["lane, unguarded"] = lambda: lane(call.src, call.dst, call.op, ctx, call.opts)
    if args.recorder:  # the recorder's switch is read when a communicator's guard is made
        quiet = comm.Dup()
        kept = os.environ.get("COLLECTIVES_FLIGHT_RECORDER")
        os.environ["COLLECTIVES_FLIGHT_RECORDER"] = "0"
        try:
            collectives.allreduce(x, out=y, algorithm=args.algorithm, comm=quiet)
        finally:
            if kept is None:
                del os.environ["COLLECTIVES_FLIGHT_RECORDER"]
            else:
                os.environ["COLLECTIVES_FLIGHT_RECORDER"] = kept
        variants["no recorder"] = \
            lambda: collectives.allreduce(x, out=y, algorithm=args.algorithm, comm=quiet)
    if args.abort:
        fatal = collectives.Options(on_error="abort")
        abort_plan = collectives.allreduce_init(x, out=y, algorithm=args.algorithm, options=fatal)
        variants["allreduce(abort)"] = \
            lambda: collectives.allreduce(x, out=y, algorithm=args.algorithm, options=fatal)
        variants["plan(abort)"] = abort_plan
    if not args.no_iallreduce:
        variants["iallreduce+wait"] = \
            lambda: collectives.iallreduce(x, out=y, algorithm=args.algorithm).wait()
    halves = [0, 0]  # --split: ns in iallreduce() and in wait() during the variant's turn
    if args.split:
        clock = time.perf_counter_ns

        def split() -> None:
            t0 = clock()
            request = collectives.iallreduce(x, out=y, algorithm=args.algorithm)
            t1 = clock()
            request.wait()
            halves[0] += t1 - t0
            halves[1] += clock() - t1

        variants["iallreduce (split)"] = split
    recording = None
    if args.timeline:
        from collectives.diagnostics.timeline import hooks
        from collectives.diagnostics.timeline.recorder import Recorder

        recording = Recorder()
        variants["timeline on"] = variants["allreduce"]
    for name, f in variants.items():  # warm up: engine, plan resolution, caches
        if name == "timeline on":
            hooks.install(recording)
        for _ in range(200):
            f()
        if name == "timeline on":
            hooks.uninstall()
    halves[:] = [0, 0]  # (the warm-up's)
    times = {name: [] for name in variants}
    if args.split:
        times["iallreduce() half"], times[".wait() half"] = [], []
    spans = calls_on = 0
    for _ in range(args.rounds):
        for name, f in variants.items():
            calls = args.calls
            if name == "timeline on":
                before = recording.count()
                hooks.install(recording)
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                f()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
            if name == "iallreduce (split)":
                for half, ns in zip(("iallreduce() half", ".wait() half"), halves):
                    times[half].append(ns / calls / 1e3)
                halves[:] = [0, 0]
            if name == "timeline on":
                hooks.uninstall()
                spans += recording.count() - before
                calls_on += calls
    medians = {name: float(np.median(t)) for name, t in times.items()}
    if comm.rank == 0:
        print(f"# per-call time at {x.nbytes} B, {comm.size} ranks, algorithm {args.algorithm}, "
              f"median of {args.rounds} rounds")
        print(f"{'variant':<22}{'us/call':>10}{'/ bare':>10}")
        for name, us in medians.items():
            print(f"{name:<22}{us:>10.2f}{us / medians['bare']:>10.2f}")
        if args.timeline:
            per_call = spans / calls_on
            print(f"# timeline: {per_call:g} spans per call, "
                  f"{(medians['timeline on'] - medians['allreduce']) / per_call:.2f} us per span")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"bytes": int(x.nbytes), "ranks": comm.size, "rounds": times,
                           "median_us": medians}, fh, indent=1)
    bare_comm.Free()
    if args.recorder:
        quiet.Free()
    return medians


if __name__ == "__main__":
    main()
