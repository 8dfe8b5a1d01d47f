"""Run a command and say how many cores other processes kept busy meanwhile.

Usage::

    python bench/busy_cores.py mpiexec -n 2 python bench/allreduce_sweep.py ...

After the command ends, prints one line: the cores that processes other than the command's own
kept busy on average while it ran (the machine's busy time from ``/proc/stat``, user, nice,
system, irq and softirq, steal excluded, less the command's own children's CPU time), the
command's own, and the load average. On a machine shared with other jobs this says how quiet a
measurement was better than the load average, which counts waiting processes too. Linux only.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (``/proc/stat``'s first line)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:3]) + sum(v[5:7])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    b0, t0 = busy_seconds(), time.time()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rc = subprocess.call(sys.argv[1:])
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    b1, t1 = busy_seconds(), time.time()
    mine = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    wall = max(t1 - t0, 1e-9)
    print(f"## others used {(b1 - b0 - mine) / wall:.2f} cores on average over {wall:.0f} s "
          f"(this run {mine / wall:.2f}); load {os.getloadavg()[0]:.2f}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
