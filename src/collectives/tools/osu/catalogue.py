"""Every benchmark's entry point by its OSU program name (the console scripts' table)."""

from ..._runtime.cli import program
from . import (allgather, allreduce, alltoall, alltoallv, barrier, bcast, bw, gather, iallreduce,
               latency, reduce_scatter, scatter)

__all__ = ["BENCHMARKS", "osu_allreduce", "osu_reduce_scatter", "osu_allgather", "osu_bcast",
           "osu_alltoall", "osu_alltoallv", "osu_gather", "osu_scatter", "osu_barrier",
           "osu_latency", "osu_bw", "osu_iallreduce"]

#: Entry point ``main(argv=None, comm=None, out=None)`` of each benchmark.
BENCHMARKS = {
    "osu_allreduce": allreduce.main,
    "osu_reduce_scatter": reduce_scatter.main,
    "osu_allgather": allgather.main,
    "osu_bcast": bcast.main,
    "osu_alltoall": alltoall.main,
    "osu_alltoallv": alltoallv.main,
    "osu_gather": gather.main,
    "osu_scatter": scatter.main,
    "osu_barrier": barrier.main,
    "osu_latency": latency.main,
    "osu_bw": bw.main,
    "osu_iallreduce": iallreduce.main,
}


def _script(name: str):
    """Console script ``name``: exit status 0 (``main`` returns the records), 2 on a usage
    error; an error on any rank ends the job (one line, then MPI_Abort:
    ``_runtime.cli.program``)."""
    return program(name, lambda: BENCHMARKS[name]())


#: Console-script entry points (``[project.scripts]`` in pyproject.toml).
osu_allreduce = _script("osu_allreduce")
osu_reduce_scatter = _script("osu_reduce_scatter")
osu_allgather = _script("osu_allgather")
osu_bcast = _script("osu_bcast")
osu_alltoall = _script("osu_alltoall")
osu_alltoallv = _script("osu_alltoallv")
osu_gather = _script("osu_gather")
osu_scatter = _script("osu_scatter")
osu_barrier = _script("osu_barrier")
osu_latency = _script("osu_latency")
osu_bw = _script("osu_bw")
osu_iallreduce = _script("osu_iallreduce")
