"""What moving data between two cores costs on this machine: the shared-memory allreduce's floor.

Usage::

    python bench/core_to_core.py [--sizes 64K,512K] [--calls 200] [--json FILE]

No MPI: this process and a child (forked), on two different cores where the machine has two,
share a buffer (``multiprocessing.shared_memory``, the kind of pages an MPI shared window has)
and take turns on it through a flag, as the ranks of ``algorithm="shm"`` do through the
window's counters (atomic loads and stores with acquire and release ordering). It prints:

- ``round trip``: one flag's cache line to the other core and back (the child answers each
  value the parent stores): what one hand-off of a round costs twice;
- for each size, the microseconds (median over ``--calls``) and GB/s of one copy with
  ``np.copyto`` into or out of the shared buffer, the other process having touched it last,
  against the same copy when this process touched it last:

  - ``read theirs``: copy out of the shared buffer, which the other core has just written (a
    reduce reading another rank's staged segment, a copy out of its output slot);
  - ``write theirs``: copy into the shared buffer, which the other core has just read (staging
    into a slot that the other rank read in an earlier round);
  - ``local``: the same copies when this core wrote or read the buffer last.

Where a cache line takes long to go from core to core (a virtual machine's two vCPUs far apart
on the host), each line the other core holds costs that trip, and the slots' staging and
copying out, which move each byte between cores, run far below a local copy; the
``collectives.empty`` buffers' path, which reads inputs nobody rewrote in place, does not pay it
(docs/benchmarks/shm.md, "Where the time goes").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from multiprocessing import Process, shared_memory

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from collectives.tools.osu.options import parse_sizes

DEFAULT_SIZES = "64K,512K"
#: the flags' addresses: the parent's turn counter at 0, the child's a cache line further
PARENT, CHILD = 0, 64
#: the child's actions, chosen by the parent through the flags' word 2
ANSWER, WRITE, READ = 0, 1, 2


@intrinsic
def _flag(typingctx, addr, value):
    """The int64 flag at ``addr``: stored (release) when ``value`` >= 0, and read (acquire)
    after: the window counters' atomic operations, which the compiler keeps inside a loop."""
    if not isinstance(addr, types.Integer) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        new = context.cast(builder, args[1], signature.args[1], types.int64)
        with builder.if_then(builder.icmp_signed(">=", new, ir.Constant(new.type, 0))):
            builder.store_atomic(new, ptr, "release", 8)
        return builder.load_atomic(ptr, "acquire", 8)

    return types.int64(addr, value), codegen


@njit(cache=False)
def load_acquire(addr: int) -> int:  # pragma: no cover - compiled
    return _flag(addr, -1)


@njit(cache=False)
def store_release(addr: int, value: int) -> None:  # pragma: no cover - compiled
    _flag(addr, value)


@njit(cache=False)
def _ping(flags: int, rounds: int) -> None:  # pragma: no cover - compiled
    """The parent's side of ``rounds`` round trips: store a value, wait for the child's echo."""
    for i in range(rounds):
        value = load_acquire(flags + PARENT) + 1
        store_release(flags + PARENT, value)
        while load_acquire(flags + CHILD) != value:
            pass


@njit(cache=False)
def _serve(flags: int, data, scratch) -> None:  # pragma: no cover - compiled
    """The child: wait for each new parent value, act (answer only, write the data with new
    values, or read it all into ``scratch``), then echo the value; a negative value ends."""
    seen = 0
    while True:
        value = load_acquire(flags + PARENT)
        if value == seen:
            continue
        if value < 0:
            return
        action, count = load_acquire(flags + 16), load_acquire(flags + 24)
        if action == WRITE:
            for i in range(count):
                data[i] = value + i
        elif action == READ:
            for i in range(count):
                scratch[i] = data[i]
        seen = value
        store_release(flags + CHILD, value)


def _pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[core]})


def _median_us(samples: list[float]) -> float:
    return float(np.median(samples)) * 1e6


def measure(sizes: list[int], calls: int) -> dict:
    """Time the round trip and each size's copies; the child runs on the second core."""
    biggest = max(sizes)
    shm = shared_memory.SharedMemory(create=True, size=4096 + biggest)
    try:
        flags = np.ndarray(512, np.int64, shm.buf, 0)
        flags[:] = 0
        address = flags.ctypes.data
        data = np.ndarray(biggest // 8, np.int64, shm.buf, 4096)
        scratch = np.empty_like(data)
        _ping(address, 0)  # compile both before the fork (a negative value: return at once)
        ended = np.zeros(16, np.int64)
        ended[PARENT // 8] = -1
        _serve(ended.ctypes.data, data[:1], scratch[:1])

        def child() -> None:
            _pin(1)
            _serve(address, data, scratch)

        worker = Process(target=child, daemon=True)
        worker.start()
        _pin(0)
        try:
            return _measure(flags, address, data, sizes, calls)
        finally:
            flags[PARENT // 8] = -1
            worker.join(10)
    finally:
        shm.close()
        shm.unlink()


def _turn(flags: np.ndarray, address: int, action: int, words: int) -> None:
    """Have the child do ``action`` on the data's first ``words`` and wait until it did."""
    flags[2], flags[3] = action, words
    _ping(address, 1)


def _measure(flags: np.ndarray, address: int, data: np.ndarray, sizes: list[int],
             calls: int) -> dict:
    flags[2] = ANSWER  # the round trips: the child only echoes
    _ping(address, 1000)  # warm
    start = time.perf_counter()
    trips = 20000
    _ping(address, trips)
    result = {"round_trip_ns": (time.perf_counter() - start) / trips * 1e9, "sizes": {}}
    for nbytes in sizes:
        shared = data[:nbytes // 8]
        mine = np.ones_like(shared)
        times: dict[str, list[float]] = {k: [] for k in
                                         ("read theirs", "read local", "write theirs",
                                          "write local")}
        for _ in range(calls):
            for name, action, into, source in (("read theirs", WRITE, mine, shared),
                                               ("read local", None, mine, shared),
                                               ("write theirs", READ, shared, mine),
                                               ("write local", None, shared, mine)):
                if action is None:  # this core touched it last: the copy before, again
                    np.copyto(into, source)
                else:
                    _turn(flags, address, action, shared.size)
                t = time.perf_counter()
                np.copyto(into, source)
                times[name].append(time.perf_counter() - t)
                if action == WRITE and not (mine[0] == flags[PARENT // 8] and
                                            mine[-1] == mine[0] + mine.size - 1):
                    raise SystemExit("the copy did not read what the other process wrote")
        result["sizes"][nbytes] = {k: _median_us(v) for k, v in times.items()}
    return result


def _table(result: dict) -> str:
    lines = [f"# one cache line core to core and back: {result['round_trip_ns']:.0f} ns",
             "#    bytes  read theirs us  GB/s  read local us  GB/s  write theirs us  GB/s  "
             "write local us  GB/s"]
    for nbytes, row in result["sizes"].items():
        cells = []
        for name in ("read theirs", "read local", "write theirs", "write local"):
            us = row[name]
            cells.append(f"{us:14.1f} {int(nbytes) / us / 1e3:5.1f}")
        lines.append(f"{int(nbytes):10d} " + " ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="bytes per copy (K/M suffixes)")
    parser.add_argument("--calls", type=int, default=200, help="copies per size and kind")
    parser.add_argument("--json", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    sizes = [max(8, s // 8 * 8) for s in parse_sizes(args.sizes)]
    result = measure(sizes, args.calls)
    result["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    result["load_average"] = os.getloadavg()[0]
    print(_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
