"""``osu_allreduce --codec``: compressed allreduce columns and bytes on the wire.

Each ``--codec NAME[:k=v,...]`` becomes a column labelled by its spec that times
:func:`collectives.compressed_allreduce` (op "avg", the ``--strategy`` given or the codec's
automatic one) on the state :func:`codec_state` builds. Bytes on the wire (kB per rank and call)
come from one untimed call per column measured with :data:`collectives.TRAFFIC` (averaged over
ranks); what MPI's own ``MPI_Allreduce`` sends is not counted by the library, so a dense column
that sent nothing through it (``native``, or ``auto`` where it picked native) reports the ring's
``2 S (p-1) / p``, what a bandwidth-optimal MPI_Allreduce sends. A lossy column's ``-c`` check is
that every rank holds the same bits.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from mpi4py import MPI

from ..._runtime.cli import UsageError
from ...compressed import CompressionState, compressed_allreduce
from ..._runtime.traffic import TRAFFIC

__all__ = ["codec_state", "codec_calls", "bytes_per_call", "identical_everywhere"]


def codec_state(spec: str, rank: int) -> CompressionState:
    """The state a ``--codec`` spec is timed with on ``rank``: ``CompressionState.from_spec``
    with error feedback where the codec declares it needs it (seed 0: private randomness from
    ``(0, rank)``)."""
    return CompressionState.from_spec(spec, rank=rank, error_feedback=None)


def codec_calls(specs: list[str], strategy: str,
                comm: MPI.Comm) -> dict[str, Callable[[np.ndarray, np.ndarray], object]]:
    """One ``call(x, out)`` per codec spec, by label; raises UsageError on a bad spec."""
    calls = {}
    for spec in specs:
        try:
            codec = codec_state(spec, comm.rank)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"--codec {spec}: {exc}") from None
        steps = iter(range(1 << 62))

        def call(x, out, codec=codec, steps=steps):  # one error-feedback key per message size
            return compressed_allreduce(x, codec, out=out, strategy=strategy, comm=comm,
                                        key=f"osu-{x.size}", step=next(steps))

        calls[spec] = call
    return calls


def bytes_per_call(call: Callable[[], object], comm: MPI.Comm) -> float:
    """Bytes this library sent in one ``call()``, averaged over the ranks of ``comm``."""
    before = TRAFFIC.bytes_sent
    call()
    return comm.allreduce(TRAFFIC.bytes_sent - before, op=MPI.SUM) / comm.size


def identical_everywhere(out: np.ndarray, comm: MPI.Comm) -> bool:
    """Whether every rank's ``out`` has the same bytes."""
    rows = comm.allgather(out.tobytes())
    return all(r == rows[0] for r in rows)
