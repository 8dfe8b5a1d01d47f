"""The MPI library's shared-memory files that ``MPI_Abort`` leaves behind, removed before it.

MPICH keeps its intranode segment (and each shared window's) as a file ``/dev/shm/mpich_shm_*``
and Open MPI as ``/dev/shm/sm_segment.*`` (``vader_segment.*`` before 5.0). A job that ends
normally removes them; one that ends with ``MPI_Abort`` leaves them: a few MiB of memory each,
held until the machine restarts, and under a container's small ``/dev/shm`` (Docker's default
is 64 MiB) a few dozen aborted jobs leave no room for the next job's segment. Every way this
library ends a job goes through ``cli.abort_world``, which first removes the names of the
segments this process maps (:func:`unlink_mapped`).

Removing a name frees nothing yet: every process that maps the segment (this one, and the other
ranks of this node, which the abort is ending) keeps it until it exits, and then the memory goes.
Only the MPI libraries' own names are touched, never another file in ``/dev/shm``. The segments
of other nodes are left to their own ranks (an abort ends those without running this code). Linux
only (``/proc/self/maps``); elsewhere nothing is removed.
"""

from __future__ import annotations

import os

__all__ = ["MPI_SEGMENTS", "mapped", "unlink_mapped"]

#: the beginnings of the names, in ``/dev/shm``, of the MPI libraries' shared-memory segments
MPI_SEGMENTS = ("mpich_shm_", "sm_segment.", "vader_segment.")


def mapped(maps: str = "/proc/self/maps") -> list[str]:
    """The paths of the MPI segments this process maps, each once, in the order of ``maps``."""
    try:
        with open(maps) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        if len(fields) < 6:
            continue
        path = fields[5].removesuffix(" (deleted)")
        if (path.startswith("/dev/shm/") and os.path.basename(path).startswith(MPI_SEGMENTS)
                and path not in found):
            found.append(path)
    return found


def unlink_mapped(maps: str = "/proc/self/maps") -> list[str]:
    """Remove the names of the MPI segments this process maps (see the module); the paths
    removed. A name already gone (another rank of the node removed it first) is skipped."""
    gone = []
    for path in mapped(maps):
        try:
            os.unlink(path)
        except OSError:
            continue
        gone.append(path)
    return gone
