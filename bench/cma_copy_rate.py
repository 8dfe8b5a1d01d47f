"""How fast cross-memory attach copies, against a memcpy of the same bytes, on this machine.

Usage::

    python bench/cma_copy_rate.py [--sizes 256K,1M,4M] [--calls 100] [--json FILE]

One process, no MPI: a child process holds a buffer (written once), and this one copies it
into its own buffer, alternately by ``process_vm_readv`` (what the shared-memory allreduce's
cross-memory attach path calls, ``_runtime/shmem/kernels/copies.py``) and by ``np.copyto``
between two buffers of its own (the user-space copy that the window's slots cost per byte).
Prints the median over ``--calls`` of each, in microseconds and GB/s, and their ratio. Both
buffers stay in cache up to a few MiB, so the ratio is the kernel path's own cost per byte
(pinning each 4 KiB page of the other process, then copying it), not the memory's.
docs/benchmarks/shm.md, "Where the time goes".
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np

from collectives.tools.osu.options import parse_sizes

DEFAULT_SIZES = "64K,256K,1M,2M,4M,16M"


def _readv():
    """The C library's ``process_vm_readv``, typed."""
    fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                   ctypes.c_ulong, ctypes.c_ulong]
    return fn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"bytes (default {DEFAULT_SIZES})")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    sizes = parse_sizes(args.sizes)
    readv = _readv()
    src = np.ones(max(sizes), np.uint8)  # the child's copy (fork: copy-on-write, written below)
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    child = os.fork()
    if child == 0:  # hold a private, written buffer at the same address until told to exit
        src.fill(7)
        os.write(ready_w, b"x")
        os.read(done_r, 1)
        os._exit(0)
    os.read(ready_r, 1)
    rows = []
    try:
        for n in sizes:
            dst = np.zeros(n, np.uint8)
            mine = np.ones(n, np.uint8)
            iov = np.array([dst.ctypes.data, n, src.ctypes.data, n], np.uint64)
            if readv(child, iov.ctypes.data, 1, iov.ctypes.data + 16, 1, 0) != n or \
                    not (dst == 7).all():  # the child's bytes, not this process's ones
                raise OSError(ctypes.get_errno(), "process_vm_readv did not copy the child's "
                              "buffer: " + os.strerror(ctypes.get_errno()))
            t_cma, t_copy = [], []
            for i in range(args.calls + 5):
                t = time.perf_counter()
                got = readv(child, iov.ctypes.data, 1, iov.ctypes.data + 16, 1, 0)
                t1 = time.perf_counter()
                np.copyto(dst, mine)
                t2 = time.perf_counter()
                if got != n:
                    raise OSError(ctypes.get_errno(), "process_vm_readv: "
                                  + os.strerror(ctypes.get_errno()))
                if i >= 5:
                    t_cma.append(t1 - t)
                    t_copy.append(t2 - t1)
            cma, copy = float(np.median(t_cma)), float(np.median(t_copy))
            rows.append({"bytes": n, "cma_us": cma * 1e6, "memcpy_us": copy * 1e6,
                         "cma_gbs": n / cma / 1e9, "memcpy_gbs": n / copy / 1e9})
    finally:
        os.write(done_w, b"x")
        os.waitpid(child, 0)
    print(f"# process_vm_readv from another process against np.copyto, median of {args.calls}; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'bytes':>10} {'cma us':>10} {'GB/s':>6} {'memcpy us':>10} {'GB/s':>6} {'ratio':>6}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['cma_us']:>10.1f} {r['cma_gbs']:>6.1f} {r['memcpy_us']:>10.1f} "
              f"{r['memcpy_gbs']:>6.1f} {r['cma_us'] / r['memcpy_us']:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
