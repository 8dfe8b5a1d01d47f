"""OSU-compatible microbenchmarks of the collectives, and reading their results back.

One module per benchmark (``allreduce``, ``reduce_scatter``, ``allgather``, ``bcast``,
``alltoall``, ``alltoallv``, ``gather``, ``scatter``, ``barrier``, ``latency``, ``bw``,
``iallreduce``), each with a ``main(argv=None, comm=None, out=None)``; the shared pieces are
``options`` (OSU's command
line), ``timing`` (OSU's timing loop), ``report`` (OSU's layout and bus bandwidth),
``collective`` (the loop all collective benchmarks share), ``pt2pt`` (the loop of the
point-to-point ones), ``results`` (JSON/CSV), ``plot`` (figures and tables from result files),
``schedule`` (the allreduce algorithms' message patterns, recorded from real calls and drawn)
and ``catalogue`` (the table of entry points). Run them under ``mpiexec`` as console scripts (``osu_allreduce``) or modules (``python -m collectives.tools.osu.allreduce``).
This package module imports nothing, so ``python -m`` runs each cleanly.
"""
