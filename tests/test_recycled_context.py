"""A communicator freed after its ranks' MPI collectives went different ways must never hand its
context id, and the messages still queued under it, to a later communicator.

After a failure some ranks retire native (``_runtime/guard.py``) and run a hand-written
equivalent, while a rank that has not heard of the failure yet posts the MPI collective: its
messages then wait, unmatched, in the other ranks' queues under the native duplicate's context
id. MPICH agrees on a new communicator's context id among that communicator's members only, so
once the ranks that hold those messages free the duplicate, a duplicate of a sub-communicator
without the posting rank can get the same id, and its collective with the same place in its
sequence receives the old message: silently, truncated to its own size. The CI run of
2026-12-06 met it as ``mpi_blocks.py::test_reduce_scatter[split-False-native-np4]`` on rank 2:
its own block plus the first two elements of what rank 1 had sent it in
``mpi_alltoall.py::test_repeated_calls_recheck_what_can_change[native-np4]`` (docs/reliability.md,
"Collectives that went different ways"). The scene is set in a fresh job, where MPICH's choice of
context ids is the same on every run; three ranks.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from collectives.tools.launch import mpiexec_command

ROOT = Path(__file__).resolve().parents[1]

SCENE = """
    import numpy as np
    from mpi4py import MPI

    import collectives
    from collectives._runtime import release

    world = MPI.COMM_WORLD
    r = world.rank
    E, L, F = 0, 1, 2  # learns of the failure early, late (posts the native call), fails
    a = world.Dup()
    x = np.arange(12, dtype=np.float32) + 100 * r
    collectives.alltoall(x, algorithm="native", comm=a)  # the ranks agree on its signature
    # F fails before any message, once L (a leaf) has sent its part and returned; E (the root)
    # learns of it there
    if r == F:
        world.recv(source=L, tag=7)
    bad = np.zeros(3, np.complex64) if r == F else np.zeros(3, np.float32)
    try:
        collectives.reduce(bad, root=E, algorithm="binomial", comm=a)
    except (TypeError, collectives.CollectiveError):
        assert r != L
    else:
        assert r == L
        world.send(None, dest=F, tag=7)
    # the agreed signature again: L posts MPI's alltoall, E and F (retired) run pairwise; L
    # learns of the failure in its wait and runs pairwise too: every result is right
    y = collectives.alltoall(x, algorithm="native", comm=a)
    want = np.concatenate([np.arange(4 * r, 4 * r + 4) + 100 * k for k in range(3)])
    assert np.array_equal(y, want), y
    a.Free()
    while release.pending():
        release.progress()
    world.Barrier()
    # a communicator of E and F, F first (F's peer is its rank 1, as L was in a)
    b = world.Split(0 if r in (E, F) else 1, -r)
    wrong = []
    if r != L:
        full = sum(np.arange(3, dtype=np.float32) + 10 * q + 0.5 for q in range(2))
        for call in range(4):
            xb = np.arange(3, dtype=np.float32) + 10 * b.rank + 0.5
            yb = collectives.reduce_scatter(xb, algorithm="native", comm=b)
            ref = full[:2] if b.rank == 0 else full[2:]
            if not np.array_equal(yb, ref):
                wrong.append((call, yb.tolist(), ref.tolist()))
    b.Free()
    everyone = world.gather(wrong, root=0)
    if r == 0:
        print("wrong:", everyone, flush=True)
"""


def test_a_stale_collective_message_never_reaches_a_recycled_communicator():
    """The scene above in a fresh 3-rank job: every native reduce-scatter on the new
    communicator equals the reference. (Before, F's second one returned its own block plus
    L's stale one: [108.5, 110.5] for [11, 13].)"""
    run = subprocess.run([*mpiexec_command(), "-n", "3", sys.executable, "-c",
                          textwrap.dedent(SCENE)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    assert "wrong: [[], [], []]" in run.stdout, run.stdout[-2000:]
