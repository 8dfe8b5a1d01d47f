"""The process mesh: every axis set's communicator has the ranks a hand computation says, in its
order, at every world size and for shapes with singleton axes; bad shapes fail on every rank.

The hand computation: ``np.arange(p).reshape(shape)`` is the grid (row-major, the ranks of one
node consecutive: one machine, block placement), and the members of an axis set are the slice
that fixes this rank's coordinates on the other axes, read in row-major order.
"""

from itertools import combinations

import numpy as np
import pytest
from mpi4py import MPI

import collectives


def _shapes(p):
    """Shapes of p ranks in 1 to 3 axes, singleton axes included."""
    divisors = [d for d in range(1, p + 1) if p % d == 0]
    shapes = {(p,), (1, p), (p, 1), (1, 1, p), (p, 1, 1)}
    shapes |= {(a, p // a) for a in divisors}
    shapes |= {(a, b, p // (a * b)) for a in divisors for b in divisors if p % (a * b) == 0}
    return sorted(shapes)


def test_axis_communicators_match_the_hand_computation():
    world = MPI.COMM_WORLD
    r, p = world.rank, world.size
    for shape in _shapes(p):
        names = ("dp", "pp", "tp")[-len(shape):]
        grid = np.arange(p).reshape(shape)
        me = tuple(int(c) for c in np.argwhere(grid == r)[0])
        with collectives.Mesh(shape, names) as mesh:
            assert mesh.shape == shape and mesh.names == names and mesh.coords() == me
            assert all(mesh.rank_of(mesh.coords(q)) == q for q in range(p))
            assert mesh.rank_of(np.array(me)) == r  # NumPy ints too
            for k in range(1, len(shape) + 1):
                for axes in combinations(range(len(shape)), k):
                    index = tuple(slice(None) if i in axes else me[i] for i in range(len(shape)))
                    want = grid[index].ravel().tolist()
                    for named in ([names[i] for i in axes], list(reversed(axes))):
                        c = mesh.comm(named)
                        got = c.Get_group().Translate_ranks(None, world.Get_group())
                        assert got == want, (shape, named)
            assert mesh.comm().Get_group().Translate_ranks(None, world.Get_group()) == \
                list(range(p))
            for i, name in enumerate(names):
                n, c = shape[i], me[i]
                assert mesh.size(name) == n == mesh.comm(name).size
                assert mesh.comm(name).rank == c
                assert mesh.neighbors(name) == (c - 1 if c else None, c + 1 if c < n - 1 else None)
                assert mesh.neighbors(i, periodic=True) == ((c - 1) % n, (c + 1) % n)


def test_allreduce_on_an_axis_equals_one_on_a_hand_split():
    world = MPI.COMM_WORLD
    r, p = world.rank, world.size
    tp = 2 if p % 2 == 0 else 1
    x = np.arange(7.0) * (r + 1)
    hand = world.Split(color=r // tp, key=r)  # tp is innermost: consecutive ranks
    try:
        with collectives.Mesh((p // tp, tp), ("dp", "tp")) as mesh:
            assert np.array_equal(collectives.allreduce(x, comm=mesh.comm("tp")),
                                  collectives.allreduce(x, comm=hand))
            dp = mesh.comm("dp")  # and along dp: the same column of every row
            assert np.array_equal(collectives.allreduce(x, comm=dp),
                                  sum(np.arange(7.0) * (q + 1) for q in range(p)
                                      if q % tp == r % tp))
    finally:
        hand.Free()


def test_free_and_context_manager():
    p = MPI.COMM_WORLD.size
    mesh = collectives.Mesh((p,), ("dp",))
    c = mesh.comm("dp")
    mesh.free()
    mesh.free()  # twice: nothing more
    assert c == MPI.COMM_NULL  # mpi4py sets a freed handle to COMM_NULL
    with pytest.raises(ValueError, match="freed"):
        mesh.comm("dp")


def _bad(p):
    return [
        (((p + 1,), ("dp",)), ValueError, f"holds {p + 1} ranks, the communicator has {p}"),
        (((p, 0), ("dp", "tp")), ValueError, "positive size"),
        (((p, -1), ("dp", "tp")), ValueError, "positive size"),
        (((p,), ("dp", "tp")), ValueError, "2 names"),
        (((p, 1), ("dp", "dp")), ValueError, "must differ"),
        (((p, 1, 1),), ValueError, None),  # the default names are three: fine, shape is p,1,1
        (((p,),), ValueError, "3 names"),
        ((p, ("dp",)), TypeError, "sequence of ints"),
        (((float(p),), ("dp",)), TypeError, "must hold ints"),
        (((p,), "dp"), TypeError, "names must be"),
    ]


@pytest.mark.world_sizes(1, 2, 3)
def test_bad_shapes_raise_on_every_rank():
    p = MPI.COMM_WORLD.size
    for args, kind, words in _bad(p):
        if words is None:
            collectives.Mesh(*args).free()
            continue
        with pytest.raises(kind, match=words) as info:
            collectives.Mesh(*args)
        assert "on rank " + ", ".join(map(str, range(p))) in str(info.value)
    mesh = collectives.Mesh((p,), ("dp",))
    with pytest.raises(ValueError, match="unknown axis 'tp'; the axes are dp"):
        mesh.comm("tp")
    with pytest.raises(ValueError, match="coords must be"):
        mesh.rank_of((p,))
    mesh.free()


@pytest.mark.world_sizes(2, 3)
def test_arguments_that_differ_across_ranks_raise_everywhere():
    world = MPI.COMM_WORLD
    names = ("dp",) if world.rank == 0 else ("data",)
    with pytest.raises(ValueError, match="arguments differ across ranks"):
        collectives.Mesh((world.size,), names)
    if world.size > 2:  # a bad shape on one rank only: the same error on every rank
        shape = (world.size + 1,) if world.rank == 1 else (world.size,)
        with pytest.raises(ValueError, match="invalid arguments on rank 1: .*holds"):
            collectives.Mesh(shape, ("dp",))
