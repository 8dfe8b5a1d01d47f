"""The multi-rank suite (tests/mpi/mpi_*.py) under a real mpiexec, at every world size we sweep.

1, 2, 3, 4, 5, 7 and 8 ranks: powers of two and not, most of them oversubscribed on a 2-core
machine. Each run has a timeout, so a hang fails with the name of the test each rank was in.
"""

import pytest

from mpirun import run_suite

WORLD_SIZES = [1, 2, 3, 4, 5, 7, 8]
TIMEOUT_S = 600


@pytest.mark.parametrize("nprocs", WORLD_SIZES)
def test_mpi_suite(nprocs, tmp_path):
    run_suite(nprocs, tmp_path, TIMEOUT_S)
