"""Compressed allreduce: only compressed data travels (see ``strategies.py`` for the catalogue)."""

from .api import compressed_allreduce
from .auto import AutoCompression, CodecSpeed
from .state import CompressionState
from .strategies import STRATEGIES

__all__ = ["compressed_allreduce", "CompressionState", "STRATEGIES", "AutoCompression",
           "CodecSpeed"]
