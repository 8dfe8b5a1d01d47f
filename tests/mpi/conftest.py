"""Communicators every multi-rank test body runs on (mpi4py's way: one body, many comms)."""

import pytest
from mpi4py import MPI


def _split():
    world = MPI.COMM_WORLD
    # two interleaved halves, ranks reversed inside each: nothing lines up with COMM_WORLD
    return world.Split(color=world.rank % 2, key=-world.rank)


COMMS = {"world": lambda: MPI.COMM_WORLD, "split": _split, "self": lambda: MPI.COMM_SELF}


@pytest.fixture(params=list(COMMS))
def comm(request):
    c = COMMS[request.param]()
    yield c
    if request.param == "split":
        c.Free()  # also frees the library's private duplicate (an attribute of c)
