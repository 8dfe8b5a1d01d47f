"""Allgather strategy: every rank gathers every payload, decodes and aggregates. Any codec.

Each rank encodes its whole vector into one payload; payload sizes are allgathered first (they
differ for threshold-style codecs), then the payloads by a ring allgather (``_exchange.py``). Every
rank decodes all ``p`` payloads and aggregates them in rank order, so all ranks compute the same
bits. Sparse payloads are added into one dense sum at their indices, without decoding each to a
dense vector (``TensorCoding.aggregate_into``).

Cost with payload size c bytes: (p-1) alpha + c (p-1) beta on the wire (each rank receives every
other payload), and p decodes per rank (sparse payloads: O(k) each, plus one dense sum). Cheap
when c is small (1-bit, top-0.1%); it does not scale with p the way a reduction does, which is
what the sparse and two-phase strategies fix.
"""

from __future__ import annotations

import numpy as np

from .._runtime.context import Context
from ..options import Options
from ._exchange import allgatherv
from .coding import TensorCoding

__all__ = ["allreduce"]


def allreduce(x: np.ndarray, out: np.ndarray, coding: TensorCoding, ctx: Context, opts: Options,
              algorithm: str) -> None:
    payload = coding.encode(x)
    payloads = allgatherv(payload, ctx)
    coding.aggregate_into(payloads, x.size, out)
