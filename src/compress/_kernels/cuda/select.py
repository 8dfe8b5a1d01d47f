"""Exact selection on the device: radix select of the k-th largest magnitude key, then an ordered
compaction (private).

Keys are the host's magnitude keys, ``bits & absmask`` (:mod:`compress._kernels.sparse`).

*Radix select* finds the k-th largest key ``v`` one byte at a time from the top: :func:`radix_histogram`
counts, per block in shared memory and then with one atomic add per bin, the next byte of every key that
matches the bytes fixed so far; the host walks the 256 counts down to the bin holding the k-th key. That
is ``itemsize`` passes over the keys, and it also gives ``greater``, the number of keys above ``v``.

*Compaction* keeps, in ascending index order, every key ``> v`` and the first ``ties`` keys ``== v``
(ties to the lowest index, the host rule). The input is cut into tiles of :data:`TILE` elements;
:func:`tile_counts` counts both classes per tile, the host turns the counts into exclusive offsets, and
:func:`tile_write` scans the per-thread counts of each tile in shared memory (each thread owns
:data:`ITEMS` consecutive elements) and writes every kept index at ``greater_before + min(equal_before,
ties)``. "Keys ``>= t``" is the same call with ``v = t`` and unlimited ties.
"""

from numba import cuda, int64, uint64

from . import THREADS
from .reduce import tree_sum
from .scalar import uniform_below

__all__ = ["TILE", "radix_histogram", "tile_counts", "tile_write", "gather_keys", "sample_keys"]

#: elements per thread in a compaction tile, and per tile
ITEMS = 16
TILE = ITEMS * THREADS


@cuda.jit
def radix_histogram(u, absmask, prefix, prefix_mask, shift, hist):
    """``hist[d] +=`` the number of keys with ``key & prefix_mask == prefix`` and byte ``d`` at ``shift``."""
    local = cuda.shared.array(256, int64)
    t = cuda.threadIdx.x
    for d in range(t, 256, THREADS):
        local[d] = 0
    cuda.syncthreads()
    mask = uint64(absmask)
    for i in range(cuda.grid(1), u.size, cuda.gridsize(1)):
        key = uint64(u[i]) & mask
        if (key & prefix_mask) == prefix:
            cuda.atomic.add(local, int64((key >> shift) & uint64(255)), 1)
    cuda.syncthreads()
    for d in range(t, 256, THREADS):
        if local[d]:
            cuda.atomic.add(hist, d, local[d])


@cuda.jit(device=True)
def _thread_counts(u, mask, v, lo, hi):
    """(#keys > v, #keys == v) among ``u[lo:hi]``."""
    a = 0
    b = 0
    for i in range(lo, hi):
        key = uint64(u[i]) & mask
        a += key > v
        b += key == v
    return a, b


@cuda.jit
def tile_counts(u, absmask, v, counts):
    """``counts[tile] = (#keys > v, #keys == v)`` for every tile of :data:`TILE` elements."""
    gt = cuda.shared.array(THREADS, int64)
    eq = cuda.shared.array(THREADS, int64)
    t = cuda.threadIdx.x
    mask = uint64(absmask)
    n = u.size
    for tile in range(cuda.blockIdx.x, counts.shape[0], cuda.gridDim.x):
        lo = min(n, tile * TILE + t * ITEMS)
        gt[t], eq[t] = _thread_counts(u, mask, v, lo, min(n, lo + ITEMS))
        tree_sum(gt)
        tree_sum(eq)
        if t == 0:
            counts[tile, 0] = gt[0]
            counts[tile, 1] = eq[0]
        cuda.syncthreads()


@cuda.jit
def tile_write(u, absmask, v, ties, offsets, out):
    """Write the kept indices of every tile, ascending, from its exclusive ``offsets[tile]``.

    Thread ``t`` owns elements ``[t * ITEMS, (t + 1) * ITEMS)`` of the tile: it counts its two classes,
    an inclusive Hillis-Steele scan over the block turns the counts into the thread's starting
    positions, and the thread writes its kept indices in order.
    """
    gt = cuda.shared.array(THREADS, int64)
    eq = cuda.shared.array(THREADS, int64)
    t = cuda.threadIdx.x
    mask = uint64(absmask)
    n = u.size
    for tile in range(cuda.blockIdx.x, offsets.shape[0], cuda.gridDim.x):
        lo = min(n, tile * TILE + t * ITEMS)
        hi = min(n, lo + ITEMS)
        my_gt, my_eq = _thread_counts(u, mask, v, lo, hi)
        gt[t] = my_gt
        eq[t] = my_eq
        step = 1
        while step < THREADS:
            cuda.syncthreads()
            a = gt[t - step] if t >= step else 0
            b = eq[t - step] if t >= step else 0
            cuda.syncthreads()
            gt[t] += a
            eq[t] += b
            step *= 2
        cuda.syncthreads()
        before_gt = offsets[tile, 0] + gt[t] - my_gt
        before_eq = offsets[tile, 1] + eq[t] - my_eq
        for i in range(lo, hi):
            key = uint64(u[i]) & mask
            if key > v:
                out[before_gt + min(before_eq, ties)] = i
                before_gt += 1
            elif key == v:
                if before_eq < ties:
                    out[before_gt + before_eq] = i
                before_eq += 1
        cuda.syncthreads()


@cuda.jit
def gather_keys(u, absmask, idx, keys):
    """``keys[j] = u[idx[j]] & absmask``."""
    for j in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        keys[j] = u[idx[j]] & absmask


@cuda.jit
def sample_keys(u, absmask, stream, keys):
    """``keys[j]`` = the key at random position ``uniform_below(stream, j, n)`` (host: ``sample_keys``,
    before its sort)."""
    n = u.size
    for j in range(cuda.grid(1), keys.size, cuda.gridsize(1)):
        keys[j] = u[uniform_below(stream, j, n)] & absmask
