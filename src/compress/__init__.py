"""Gradient-compression codecs for data-parallel training (no MPI dependency).

>>> import compress
>>> codec = compress.get("topk", ratio=0.01)
>>> payload = codec.encode(x)        # one contiguous np.uint8 array
>>> y = codec.decode(payload)        # dense, x's shape and dtype

See ``docs/compression.md`` for the wire formats, properties and papers of every codec.
"""

from . import arrays, bfloat16, header, protocols
from .base import DECODE_MAX_ELEMENTS, Codec
from .memory import DGCMemory, ErrorFeedback
from .protocols import ElementSummable, LowRankSummable, Memory, SparsePayload
from .registry import CODECS, from_spec, get, parse_spec
from .schedule import SparsityWarmup

# every codec class by its name (compress.TopK, ...), from the one table
globals().update({cls.__name__: cls for cls in CODECS.values()})

__all__ = [
    "CODECS",
    "get",
    "parse_spec",
    "from_spec",
    "Codec",
    "DECODE_MAX_ELEMENTS",
    "ErrorFeedback",
    "DGCMemory",
    "SparsityWarmup",
    "ElementSummable",
    "LowRankSummable",
    "SparsePayload",
    "Memory",
    "arrays",
    "bfloat16",
    "header",
    "protocols",
    *sorted(cls.__name__ for cls in CODECS.values()),
]
