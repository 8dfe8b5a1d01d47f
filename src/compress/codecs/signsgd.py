"""signSGD: send one sign bit per element.

How it works: bit ``i`` is the IEEE sign bit of ``x[i]`` (so ``-0.0`` counts as negative); decoding
gives ``+1`` or ``-1``. Workers' signs are combined by majority vote (sign of the sum). Bernstein et
al., "signSGD: Compressed Optimisation for Non-Convex Problems", ICML 2018, and "signSGD with Majority
Vote is Communication Efficient and Fault Tolerant", ICLR 2019.

Wire size: ``header + ceil(n / 8)`` bytes, ``header = 16 + 8 * ndim``.

Properties: not summable as bits (a sum of ±1 values needs log2(p) bits: allgather the bits, or
allreduce the decoded ±1 in a small integer type), biased, no error feedback (majority vote),
aggregation "majority".
"""

from __future__ import annotations

from dataclasses import dataclass

from ._signs import SignCodec

__all__ = ["SignSGD"]


@dataclass(eq=False)
class SignSGD(SignCodec):
    """Sign of each element, ±1 on decode."""

    name = "signsgd"
    codec_id = 10
    aggregation = "majority"

    def _values(self, params):
        return 1.0, -1.0

    def _encode(self, x, ops, key, step, out):
        return self._emit(x, ops, out, {})[0]
