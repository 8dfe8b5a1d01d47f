"""Communicators every multi-rank test body runs on (mpi4py's way: one body, many comms).

Every test here is a multi-rank test: it runs under ``mpiexec`` at each world size
(``tests/mpi_launch.py``, through the autouse fixture :func:`mpi_world_size`), directly with
``mpiexec -n 4 python -m pytest --with-mpi tests/mpi``, or from a plain ``python -m pytest``.
Parametrize with values and fixtures that do not depend on MPI state: the plain run collects the
tests outside the ranks, where ``MPI.COMM_WORLD.size`` is 1 (it names any test that then exists
only inside the ranks, and fails).
"""

import pytest
from mpi4py import MPI

import collectives


def _split():
    world = MPI.COMM_WORLD
    # two interleaved halves, ranks reversed inside each: nothing lines up with COMM_WORLD
    return world.Split(color=world.rank % 2, key=-world.rank)


COMMS = {"world": lambda: MPI.COMM_WORLD, "split": _split, "self": lambda: MPI.COMM_SELF}


@pytest.fixture(autouse=True)
def mpi_world_size(request):
    """The world size the test runs at: parametrized by ``tests/mpi_launch.py`` (ids ``np4``)."""
    return getattr(request, "param", None) or MPI.COMM_WORLD.size


#: Which shm round driver each rank runs: the kernel everywhere, or the interpreted driver (what
#: a rank runs while its kernel compiles) on the even ranks of COMM_WORLD and the kernel on the
#: odd ones, meeting in the same calls (``team.INTERPRET``).
SHM_DRIVERS = {"kernel": False, "mixed": MPI.COMM_WORLD.rank % 2 == 0}


@pytest.fixture(params=list(SHM_DRIVERS))
def shm_driver(request, monkeypatch):
    """The test body with the kernel on every rank, and with the ranks on one or the other."""
    from collectives._runtime.shmem import team
    from collectives._runtime.shmem.kernels import interpreted

    if request.param == "mixed" and not interpreted.supported():
        pytest.skip("no interpreted round driver on this processor")
    monkeypatch.setattr(team, "INTERPRET", SHM_DRIVERS[request.param])
    return request.param


@pytest.fixture(autouse=True)
def fresh_native():
    """After a test in which a call failed on some rank, the library's own collectives are
    retired on COMM_WORLD (docs/reliability.md): collectives.reset brings them back, so that
    later tests see native where they ask for it."""
    yield
    from collectives._runtime import comm_state

    ctx = comm_state.get(MPI.COMM_WORLD, "context")
    retired = ctx is not None and ctx._guard is not None and ctx._guard.retired
    if any(MPI.COMM_WORLD.allgather(retired)):
        collectives.reset(MPI.COMM_WORLD)


#: above this many ranks, tests run on COMM_WORLD and COMM_SELF only: the split communicator (two
#: interleaved halves, ranks reversed) runs at 2 to 5 ranks (halves of 1, 2 and 3 ranks); on the
#: 2-core CI machine each 7- and 8-rank call costs milliseconds, and its halves (3 and 4 ranks)
#: would only repeat sizes that COMM_WORLD runs at
SPLIT_UP_TO = 5


@pytest.fixture(params=list(COMMS))
def comm(request):
    if request.param == "split" and MPI.COMM_WORLD.size > SPLIT_UP_TO:
        pytest.skip(f"split communicators run at 2 to {SPLIT_UP_TO} ranks (tests/mpi/conftest.py)")
    c = COMMS[request.param]()
    yield c
    if request.param == "split":
        c.Free()  # also frees the library's private duplicate (an attribute of c)


def _cupy_or_skip():
    """CuPy with a usable GPU, or skip with the reason (the CuPy cases of every test body)."""
    try:
        import cupy
    except ImportError:
        pytest.skip("CuPy is not installed (pip install '.[gpu]' on a machine with a GPU)")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy is installed but no GPU is visible")
    except Exception as exc:  # no driver, no device
        pytest.skip(f"CuPy is installed but CUDA is not usable here: {exc}")
    return cupy


@pytest.fixture(params=["numpy", "cupy"])
def backend(request):
    """``(to_device, to_host)`` of an array library: one test body over NumPy and CuPy."""
    if request.param == "numpy":
        return (lambda a: a), (lambda a: a)
    cupy = _cupy_or_skip()
    return cupy.asarray, cupy.asnumpy
