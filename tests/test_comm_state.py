"""The library's state on a communicator under one MPI attribute (collectives._runtime.comm_state).

MPICH frees a communicator's attributes one by one and empties the list only at the end; mpi4py
calls ``MPI_Topo_test`` on the handle before each Python delete callback, which, once any
topology communicator has existed in the process, walks that list, through the entry freed
before. With two attributes of ours on a communicator (the context and the engine, before) that
crashed ``Comm.Free()`` when MPICH's pool of attribute objects had just run out (as in the
3-rank suite after non-blocking neighbor rounds on the "mpi" backend). One process, no mpiexec.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CRASH = """
    from mpi4py import MPI
    from collectives._runtime.context import context
    from collectives.engine.lifecycle import engine_of

    MPI.COMM_SELF.Create_cart([1]).Free()  # a topology communicator, once, arms MPI_Topo_test
    extra = [MPI.Comm.Create_keyval() for _ in range(600)]
    holder = MPI.COMM_SELF.Dup()
    for n in range(600):  # n attributes in use elsewhere: one n empties MPICH's pool
        c = MPI.COMM_SELF.Dup()
        context(c)
        engine_of(c)
        for k in extra[:n]:
            holder.Set_attr(k, 0)
        c.Free()
        for k in extra[:n]:
            holder.Delete_attr(k)
    holder.Free()
    print("ok", flush=True)
"""


def test_freeing_a_communicator_with_context_and_engine_after_a_topology():
    """Context and engine on one communicator, freed after a Cartesian communicator existed,
    whatever the state of MPICH's attribute pool: no crash (this failed with a segmentation
    fault, signal 11, when each had an attribute of its own)."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(CRASH)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode,
                                                                run.stderr[-2000:])


def test_fields_free_with_the_communicator_and_reset_drops_the_context():
    from mpi4py import MPI

    from collectives._runtime import context as ctxmod
    from collectives._runtime import comm_state
    from collectives.engine import lifecycle

    c = MPI.COMM_SELF.Dup()
    ctx = ctxmod.context(c)
    engine = lifecycle.engine_of(c)
    assert comm_state.get(c, "context") is ctx and comm_state.get(c, "engine") is engine
    assert ctxmod.context(c) is ctx and lifecycle.engine_of(c) is engine  # kept, not remade
    ctxmod.reset(c)  # the context only: the engine stays
    assert comm_state.get(c, "context") is None and ctx not in ctxmod._HELD
    assert comm_state.get(c, "engine") is engine and engine in lifecycle.live_engines()
    again = ctxmod.context(c)
    assert again is not ctx and comm_state.get(c, "context") is again
    c.Free()  # both, the engine first
    assert engine not in lifecycle.live_engines() and again not in ctxmod._HELD
    assert comm_state.get(MPI.COMM_SELF, "engine") is None  # COMM_SELF's slots, set at import
    for bad in (lambda: comm_state.register("x", print), lambda: comm_state.at_finalize("x", print)):
        try:
            bad()
        except ValueError as exc:
            assert "unknown slot 'x'" in str(exc)
        else:
            raise AssertionError("an unknown slot name was accepted")


UNFREED = """
    import sys
    import numpy as np
    from mpi4py import MPI
    import collectives

    ending = sys.argv[1]
    comm = MPI.COMM_WORLD.Dup() if ending == "comm freed" else MPI.COMM_WORLD
    x = np.ones(8)
    held = [collectives.Window(x, comm=comm),
            collectives.ParameterServer(x, staleness=1, lr=0.1, comm=comm),
            collectives.PairwiseAveraging(x, comm=comm)]
    freed = collectives.Window(x, comm=comm)
    freed.free()
    if ending == "comm freed":
        comm.Free()
        try:
            held[0].free()  # freed with the communicator already: a second free does nothing
        except Exception as exc:
            raise SystemExit(f"free after the communicator's: {exc!r}")
    elif ending == "MPI.Finalize()":
        MPI.Finalize()
    print("ok", flush=True)
"""


@pytest.mark.parametrize("ending", ["exit", "MPI.Finalize()", "comm freed"])
def test_objects_holding_windows_are_freed_with_their_context_without_warnings(ending):
    """A Window, a ParameterServer and a PairwiseAveraging left unfreed are freed before MPI
    finalizes (at exit or an explicit MPI.Finalize()) or with their communicator, on every
    rank in the same order: the job ends cleanly, and MPICH over UCX prints no warning about
    memory still registered ("destroying inuse region", "not returned to mpool")."""
    from collectives.tools.launch import mpiexec_command

    run = subprocess.run([*mpiexec_command(), "-n", "2", sys.executable, "-c",
                          textwrap.dedent(UNFREED), ending],
                         capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and run.stdout.count("ok") == 2, out[-3000:]  # (lines may mix)
    assert "WARN" not in out and "inuse" not in out, out[-3000:]
