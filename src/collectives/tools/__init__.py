"""The installed tools: benchmarks, tuning, the JIT warm-up, the launcher's helpers, the demo.

- :mod:`.osu`: the OSU-style programs (``osu_allreduce`` ...) and ``collectives-plot``.
- :mod:`.tuning`: ``collectives-tune`` (measure this machine, write the tuning file ``auto``
  reads) and ``collectives-project``.
- :mod:`.warmup`: ``python -m collectives warmup`` and :func:`collectives.preload`.
- :mod:`.launch`: finding ``mpiexec`` and building its command lines.
- :mod:`.demo`: ``mpiexec -n 4 python -m collectives demo``.

For scripts of one's own (the experiment scripts of the repository's ``bench/`` use them):
:func:`program` ``(prog, main)`` is the entry point of a job's script: ``main()`` under a
handler that prints an unhandled error as one line naming the rank and ends every rank
(``MPI_Abort``) instead of leaving the others waiting; ``sys.exit(program("my_bench",
main)())``. :data:`PLOT_INSTALL` is the command that installs the plotting extra.
"""

from .._runtime.cli import PLOT_INSTALL, program

__all__ = ["PLOT_INSTALL", "program"]
