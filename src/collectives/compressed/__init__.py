"""Compressed allreduce, reduce-scatter and allgather: only compressed data travels (see
``strategies.py`` for the catalogue)."""

from .api import compressed_allreduce
from .shard import compressed_allgather, compressed_reduce_scatter
from .auto import AutoCompression, CodecSpeed
from .state import CompressionState
from .strategies import STRATEGIES

__all__ = ["compressed_allreduce", "compressed_reduce_scatter", "compressed_allgather",
           "CompressionState", "STRATEGIES", "AutoCompression",
           "CodecSpeed"]
