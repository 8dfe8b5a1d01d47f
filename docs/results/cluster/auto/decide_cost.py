"""Microseconds of AutoCompression.decide per call (memoised prediction), one process."""
import time
import numpy as np
import compress
from mpi4py import MPI
from collectives import AutoCompression
from collectives._runtime.context import context

ctx = context(MPI.COMM_WORLD)
auto = AutoCompression()
codec = compress.get("topk", ratio=0.01)
args = (codec, "grads", (17088522,), np.dtype(np.float32), "sparse", "hierarchical", ctx, None)
auto.decide(*args)
n = 2000
t = time.perf_counter()
for _ in range(n):
    auto.decide(*args)
print(f"decide: {(time.perf_counter() - t) / n * 1e6:.1f} us per call")
