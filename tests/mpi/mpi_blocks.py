"""The public building blocks (reduce_scatter, allgather, bcast, reduce) against references."""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from reference import (DTYPES, assert_identical_everywhere, counts_for, gather_all, make_input,
                       reference_allreduce, segmented)

SMALL = collectives.Options(segment_bytes=16)
FLOAT_OPS = ["sum", "max", "avg"]


def _block_counts(total, p, rank_seed):
    """Uneven counts summing to total, some of them zero (the same on every rank)."""
    rng = np.random.default_rng([total, p, rank_seed])
    cuts = np.sort(rng.integers(0, total + 1, p - 1))
    return np.diff(np.concatenate([[0], cuts, [total]])).tolist()


@pytest.mark.parametrize("algorithm", list(collectives.REDUCE_SCATTER))
@pytest.mark.parametrize("uneven", [False, True])
def test_reduce_scatter(algorithm, uneven, comm):
    p, r = comm.size, comm.rank
    for count in counts_for(p):
        for dtype in (np.dtype(np.float32), np.dtype(np.int16), np.dtype(np.float16)):
            for op in (FLOAT_OPS if dtype.kind == "f" else ["sum", "min"]):
                counts = _block_counts(count, p, 1) if uneven else None
                x = make_input(count, dtype, op, r)
                y = collectives.reduce_scatter(x, op=op, counts=counts, algorithm=algorithm,
                                               comm=comm, options=segmented(
                                                   SMALL, count, dtype.itemsize, p))
                offsets = np.concatenate([[0], np.cumsum(counts)]) if uneven else \
                    np.concatenate([[0], np.cumsum([len(a) for a in np.array_split(
                        np.empty(count), p)])])
                ref = reference_allreduce(x, op, comm)[offsets[r]:offsets[r + 1]]
                what = f"{algorithm} n={count} {dtype} {op} counts={counts}"
                assert y.shape == (offsets[r + 1] - offsets[r],), what
                if dtype.kind == "f":
                    tol = 4 * p * float(np.finfo(dtype).eps) * (np.abs(ref) + p * 4)
                    assert (np.abs(y.astype(np.float64) - ref) <= tol).all(), what
                else:
                    assert np.array_equal(y, ref), what


@pytest.mark.parametrize("algorithm", list(collectives.ALLGATHER))
@pytest.mark.parametrize("uneven", [False, True])
def test_allgather(algorithm, uneven, comm):
    p, r = comm.size, comm.rank
    for total in counts_for(p):
        for dtype in DTYPES:
            counts = _block_counts(total, p, 2) if uneven else [total // p] * p
            mine = make_input(counts[r], dtype, "sum", r)
            y = collectives.allgather(mine, counts=counts if uneven else None,
                                      algorithm=algorithm, comm=comm, options=SMALL)
            expected = np.concatenate([make_input(counts[k], dtype, "sum", k) for k in range(p)])
            assert np.array_equal(y.view(np.uint8), expected.view(np.uint8)), \
                f"{algorithm} {dtype} counts={counts}"


@pytest.mark.parametrize("algorithm", list(collectives.BCAST))
def test_bcast_every_root(algorithm, comm):
    p, r = comm.size, comm.rank
    for root in range(p):
        for count in counts_for(p):
            for dtype in (np.dtype(np.float64), np.dtype(np.uint8), np.dtype(np.float16)):
                x = make_input(count, dtype, "sum", r)
                y = collectives.bcast(x, root=root, algorithm=algorithm, comm=comm, options=SMALL)
                assert y is x
                expected = make_input(count, dtype, "sum", root)
                assert np.array_equal(x.view(np.uint8), expected.view(np.uint8)), \
                    f"{algorithm} root={root} n={count} {dtype}"


@pytest.mark.parametrize("algorithm", list(collectives.REDUCE))
def test_reduce_every_root(algorithm, comm):
    p, r = comm.size, comm.rank
    for root in range(p):
        for count in counts_for(p):
            for dtype, op in ((np.dtype(np.int32), "sum"), (np.dtype(np.int8), "max"),
                              (np.dtype(np.float32), "min"), (np.dtype(np.float64), "avg")):
                x = make_input(count, dtype, op, r)
                before = x.copy()
                y = collectives.reduce(x, op=op, root=root, algorithm=algorithm, comm=comm,
                                       options=SMALL)
                ref = reference_allreduce(x, op, comm)
                assert np.array_equal(x, before)
                if r != root:
                    assert y is None
                    continue
                what = f"{algorithm} root={root} n={count} {dtype} {op}"
                if op == "avg":
                    assert np.allclose(y, ref, rtol=1e-12, atol=1e-12), what
                else:
                    assert np.array_equal(y, ref.astype(dtype)), what


def test_reduce_in_place_on_root():
    comm = MPI.COMM_WORLD
    x = make_input(33, np.dtype(np.int64), "sum", comm.rank)
    ref = reference_allreduce(x, "sum", comm)
    y = collectives.reduce(x, out=x if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        assert y is x and np.array_equal(x, ref)


def test_blocks_compose_to_allreduce():
    """reduce_scatter then allgather with the same counts is an allreduce."""
    comm = MPI.COMM_WORLD
    x = make_input(1001, np.dtype(np.int32), "sum", comm.rank)
    part = collectives.reduce_scatter(x, options=SMALL)
    counts = gather_all(np.array([part.size]), comm).reshape(-1).tolist()
    y = collectives.allgather(part, counts=counts, options=SMALL)
    assert np.array_equal(y, reference_allreduce(x, "sum", comm))
    assert_identical_everywhere(y, comm, "compose")


@pytest.mark.world_sizes(1, 2, 3, 5)
@pytest.mark.parametrize("algorithm", list(collectives.REDUCE_SCATTER))
@pytest.mark.parametrize("uneven", [False, True])
def test_reduce_scatter_in_place(algorithm, uneven, comm):
    """``out`` a view of this rank's own block of ``x`` (NCCL's in-place layout): the same bits
    as the call out of place, landed in that block, and no other array returned."""
    p, r = comm.size, comm.rank
    for count in counts_for(p):
        for dtype in (np.dtype(np.float32), np.dtype(np.int16)):
            counts = _block_counts(count, p, 3) if uneven else None
            sizes = counts or [len(a) for a in np.array_split(np.empty(count), p)]
            lo, hi = int(sum(sizes[:r])), int(sum(sizes[:r + 1]))
            x = make_input(count, dtype, "sum", r)
            opts = segmented(SMALL, count, dtype.itemsize, p)
            expected = collectives.reduce_scatter(x, counts=counts, algorithm=algorithm,
                                                  comm=comm, options=opts)
            work = x.copy()
            y = collectives.reduce_scatter(work, out=work[lo:hi], counts=counts,
                                           algorithm=algorithm, comm=comm, options=opts)
            what = f"{algorithm} n={count} {dtype} counts={counts}"
            assert np.shares_memory(y, work) or hi == lo, what
            assert np.array_equal(work[lo:hi].view(np.uint8), expected.view(np.uint8)), what


@pytest.mark.world_sizes(1, 2, 3, 5)
@pytest.mark.parametrize("algorithm", list(collectives.ALLGATHER))
@pytest.mark.parametrize("uneven", [False, True])
def test_allgather_in_place(algorithm, uneven, comm):
    """``x`` a view of this rank's own block of ``out`` (MPI_IN_PLACE's layout): the same bytes as
    out of place; composed with the in-place reduce-scatter, the allreduce's."""
    p, r = comm.size, comm.rank
    for total in counts_for(p):
        for dtype in DTYPES:
            counts = _block_counts(total, p, 4) if uneven else [total // p] * p
            lo = int(sum(counts[:r]))
            out = np.zeros(sum(counts), dtype)
            out[lo:lo + counts[r]] = make_input(counts[r], dtype, "sum", r)
            y = collectives.allgather(out[lo:lo + counts[r]], out=out,
                                      counts=counts if uneven else None,
                                      algorithm=algorithm, comm=comm, options=SMALL)
            expected = np.concatenate([make_input(counts[k], dtype, "sum", k) for k in range(p)])
            assert y is out, f"{algorithm} {dtype} counts={counts}"
            assert np.array_equal(out.view(np.uint8), expected.view(np.uint8)), \
                f"{algorithm} {dtype} counts={counts}"
    x = make_input(1001, np.dtype(np.int32), "sum", r)
    sizes = [len(a) for a in np.array_split(x, p)]
    lo, hi = sum(sizes[:r]), sum(sizes[:r + 1])
    work = x.copy()
    collectives.reduce_scatter(work, out=work[lo:hi], algorithm=algorithm, comm=comm,
                               options=SMALL)
    collectives.allgather(work[lo:hi], out=work, counts=sizes, algorithm=algorithm, comm=comm,
                          options=SMALL)
    assert np.array_equal(work, reference_allreduce(x, "sum", comm))
    assert_identical_everywhere(work, comm, "in place")


@pytest.mark.world_sizes(1, 2, 3, 5)
def test_overlap_that_is_not_the_own_block_is_an_error(comm):
    """Only the rank's own block is in place: another overlapping out is a ValueError, on
    every rank, before any message (each rank's own check: the same error everywhere)."""
    p, r = comm.size, comm.rank
    base = np.arange(4.0 * p + 5)
    x = base[:-1]
    sizes = [len(a) for a in np.array_split(x, p)]
    lo = sum(sizes[:r])
    with pytest.raises(ValueError, match="overlaps the input"):
        collectives.reduce_scatter(x, out=base[lo + 1:lo + 1 + sizes[r]], comm=comm)
    frozen = x.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        collectives.reduce_scatter(frozen, out=frozen[lo:lo + sizes[r]], comm=comm)
    if p > 1:  # (at one rank every 4-element view of out is its own block)
        out = np.zeros(4 * p)
        shifted = out[4 * r + 1:4 * r + 5] if r < p - 1 else out[4 * r - 1:4 * r + 3]
        with pytest.raises(ValueError, match="overlaps the input"):
            collectives.allgather(shifted, out=out, comm=comm)
