"""The private machinery every collective runs on (nothing here is public API).

- ``arrays``: the one place that knows array types: checks, flat views, results of the caller's
  type; ``device``: how CuPy buffers reach MPI (CUDA-aware or staged).
- ``context``: each communicator's private duplicate and the objects cached on it;
  ``guard``: failure semantics (call numbers, notices, guarded waits, timeouts);
  ``validate``: argument set-up and the cross-rank check of ``validate=True``.
- ``p2p``: the point-to-point messages of the hand-written algorithms (guarded, counted in
  ``traffic``, logged by ``trace`` while a recording is on); ``ranks``: block and rank
  arithmetic; ``workspace``: reusable scratch buffers; ``mpitypes``: MPI datatypes and ops for
  the native calls.
- ``nodes``: which ranks share a node; ``shmem``: the shared-memory team of one node, which the
  ``shm`` and ``hierarchical`` algorithms run on.
- ``mpilib``: which MPI library mpi4py loaded; ``cli``: entry points of the programs (one line
  per error, ``MPI_Abort`` instead of a hang).

Layers (docs/architecture.md): this package imports ``options`` and ``ops`` and nothing else of
the library above it.
"""
