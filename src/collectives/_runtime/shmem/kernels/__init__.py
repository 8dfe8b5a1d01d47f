"""Numba kernels of the shared-memory collectives (private; the protocol: docs/shm-protocol.md).

Every kernel takes only arrays and scalars. Memory of other processes is reached through raw
addresses (segments of MPI shared windows as mapped in this process), which the Python side
(``team.py``) checks before it hands them over. The modules, lowest first:

- :mod:`.memory`: raw addresses as typed memory (element formats, typed pointers), the acquire
  loads and release stores of the round counters, non-temporal stores and the fence after them;
- :mod:`.arithmetic`: the reduction arithmetic, :func:`~.arithmetic.fold` and the element
  operations it is built from;
- :mod:`.copies`: byte copies (plain and streaming) and reads by cross-memory attach;
- :mod:`.protocol`: the protocol's counters, slots and descriptors: where a round's data lies,
  who has reached which round, whether two ranks make the same call;
- :mod:`.rounds`: :func:`~.rounds.run_rounds`, which drives one team call's rounds (stage,
  reduce, copy out), the one kernel ``team.py`` calls;
- :mod:`.background`: whether a kernel is ready, compiling it in a thread of its own if not;
- :mod:`.interpreted`: ``run_rounds`` run by the Python interpreter (the kernels' own code,
  NumPy for the arithmetic), which a rank runs while its kernel compiles.

This package imports nothing, so that ``team.py`` imports Numba only when a team first runs. The
kernels compile with the one option set :data:`NJIT` (``arithmetic._combine`` is inlined into
``fold`` instead). ``cache=True`` keeps the compiled code in ``__pycache__`` next to each
module; Numba checks only a kernel's own file for changes, so after editing a module whose
kernels others call (``memory``, ``arithmetic``, ``copies``, ``protocol``), delete this
package's ``__pycache__`` (or touch the callers' files) before timing or testing.
"""

__all__ = ["NJIT"]

NJIT = dict(cache=True, nogil=True, fastmath=False)
